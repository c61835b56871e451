"""examples/train_ddp.py launched as users launch it: torchrun, 2 processes, gloo on CPU."""

import json
import os
import subprocess
import sys

import torch

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_ddp.py")


def test_torchrun_two_processes_train_and_keep_the_loss_parameters_in_sync(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               EXAMPLE, "--epochs", "6", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical on all ranks: True" in done.stdout

    accuracies = json.loads((tmp_path / "accuracies.json").read_text())
    assert accuracies["identical"] is True
    assert accuracies["after"]["map_at_r"] > accuracies["before"]["map_at_r"] + 0.1  # it trains

    rank0, rank1 = (torch.load(tmp_path / f"rank-{r}.pt") for r in (0, 1))
    assert len(rank0) == len(rank1) > 0  # the proxies
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1))


def test_refuses_to_run_without_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert "launch with torchrun" in done.stderr

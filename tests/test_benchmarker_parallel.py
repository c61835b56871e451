"""Bayesian optimisation with two trials in flight on a local Ray instance (--parallel_trials 2),
on the real 48-class emoji subset (in the default run: the CI test of the parallel sweep): every trial recorded once with its record and the best
parameters; a Ray worker killed in the middle of a trial (Ray runs it again, it resumes its
folder); the driver killed and the same command run again (nothing finished is recomputed);
the reproductions in parallel and the reports."""

import os
import signal
import subprocess
import time

import pytest

from .pb_support import METRIC, check_trial_value, npm_skip, pb_skip
from .test_benchmarker_run import (
    FOLDS,
    QUICK,
    TIMEOUT,
    environment,
    file_states,
    fold_rows,
    has_rows,
    launcher_command,
    rows,
    run_launcher,
)

MISSING, pb_mark = pb_skip("powerful_benchmarker", "torchvision", "ax", "ray")
pytestmark = [pb_mark, npm_skip()]
if not MISSING:
    import yaml


ARGS = [
    "--experiment_name", "bo", *QUICK,
    "--split_manager~APPLY~2", "{num_training_sets:", "2}",
    "--config_loss_and_miners", "[mean_field_contrastive_bayes_opt]",
    "--config_optimizers", "[default,", "emoji_features,", "with_metric_loss_optimizer_bayes_opt]",
    "--reproductions", "2", "--parallel_trials", "2",
]  # fmt: skip


def ray_trial_workers():
    """The Ray actors that run the trials (parallel.TrialWorker: one per slot)."""
    listed = subprocess.run(["pgrep", "-f", "ray::TrialWorker"], capture_output=True, text=True).stdout
    return [int(pid) for pid in listed.split()]


def wait_for(condition, process):
    deadline = time.monotonic() + TIMEOUT
    while process.poll() is None and time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def start(folder, *args, log_name):
    log = open(folder / log_name, "w")
    return subprocess.Popen(
        launcher_command(folder, *args), stdout=log, stderr=subprocess.STDOUT, env=environment(), cwd=folder
    )


def test_parallel_trials_on_ray_survive_a_killed_worker_and_a_killed_driver(tmp_path):
    root = tmp_path / "bo"
    # 4 trials, 2 at a time; a worker is killed while trial 1 trains
    driver = start(tmp_path, "--bayes_opt_iters", "4", *ARGS, log_name="bo4.log")
    started = root / "bo1" / FOLDS[0] / "saved_csvs" / "logs.db"
    assert wait_for(lambda: has_rows(started, "accuracies_normalized_GlobalEmbeddingSpaceTester_level_0_VAL_vs_self")
                    and ray_trial_workers(), driver), (tmp_path / "bo4.log").read_text()[-3000:]
    os.kill(ray_trial_workers()[0], signal.SIGKILL)
    assert driver.wait(TIMEOUT) == 0, (tmp_path / "bo4.log").read_text()[-5000:]
    log = (tmp_path / "bo4.log").read_text()

    trials = rows(root / "bayes_opt_record_keeper_logs" / "logs.db", "bayes_opt")
    assert sorted(r["trial_index"] for r in trials) == [0, 1, 2, 3]  # each exactly once
    assert all(r["trial_status"] == "COMPLETED" for r in trials)
    for r in trials:  # the value ax got is the trial's own fold mean
        check_trial_value(root / f"bo{r['trial_index']}", r, rows)
    for trial in ("bo0", "bo1", "bo2", "bo3"):
        for fold in FOLDS[:2]:  # no epoch trained twice, none missing
            assert [r["epoch"] for r in fold_rows(root / trial, fold)] == [-1, 0, 1, 2], (trial, fold)
    best = yaml.safe_load((root / "best_parameters.yaml").read_text())
    best_trial = max(trials, key=lambda r: r[METRIC])
    assert best["best_sub_experiment_name"] == f"bo{best_trial['trial_index']}"
    assert best["best_values"][METRIC]["mean"] == pytest.approx(best_trial[METRIC])
    name = best["best_sub_experiment_name"]
    for i in (0, 1):
        assert (root / f"{name}_reproduction{i}" / FOLDS[1] / "saved_models").is_dir()
    assert "Reproduction 1 of" in log
    details = yaml.safe_load(
        (root / "detailed_report_MeanAggregator_accuracies_normalized_GlobalEmbeddingSpaceTester_level_0.yaml")
        .read_text()
    )
    assert sorted(details) == [name, f"{name}_reproduction0", f"{name}_reproduction1"]

    # two more trials; the driver is killed while they train, then the same command again
    finished = {t: file_states(root / t / FOLDS[0] / "saved_models") for t in ("bo0", "bo1", "bo2", "bo3")}
    driver = start(tmp_path, "--bayes_opt_iters", "6", *ARGS, log_name="bo6_killed.log")
    started = root / "bo4" / FOLDS[0] / "saved_csvs" / "logs.db"
    assert wait_for(lambda: has_rows(started, "accuracies_normalized_GlobalEmbeddingSpaceTester_level_0_VAL_vs_self"),
                    driver), (tmp_path / "bo6_killed.log").read_text()[-3000:]
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while ray_trial_workers() and time.monotonic() < deadline:  # Ray's workers go with their driver
        time.sleep(0.5)
    assert not ray_trial_workers()
    output = run_launcher(tmp_path, "--bayes_opt_iters", "6", *ARGS, log_name="bo6.log")
    for i in range(4):
        assert f"Optimization iteration {i}\n" not in output
    assert {t: file_states(root / t / FOLDS[0] / "saved_models") for t in finished} == finished
    trials = rows(root / "bayes_opt_record_keeper_logs" / "logs.db", "bayes_opt")
    assert sorted(r["trial_index"] for r in trials) == list(range(6))
    for trial in ("bo4", "bo5"):
        for fold in FOLDS[:2]:
            assert [r["epoch"] for r in fold_rows(root / trial, fold)] == [-1, 0, 1, 2], (trial, fold)

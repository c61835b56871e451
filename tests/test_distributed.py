"""Two gloo processes on CPU give the single-process gradients (float64)."""

import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from pml_fieldlosses import losses
from pml_fieldlosses.utils.distributed import DistributedLossWrapper

WORLD_SIZE, BATCH, IN_DIM, C, D = 2, 12, 5, 7, 4
CASES = {
    "MeanFieldContrastive": lambda: losses.MeanFieldContrastiveLoss(C, D, neg_margin=0.9, mf_reg_weight=0.5),
    "MeanFieldClassWiseMultiSimilarity": lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(
        C, D, alpha=2.0, beta=10.0, base=0.5, mf_reg_weight=0.5
    ),
    "ClassWiseMultiSimilarity": lambda: losses.ClassWiseMultiSimilarityLoss(alpha=2.0, beta=10.0, base=0.5),
    "PotentialField": lambda: losses.PotentialFieldLoss(
        C, D, proxies_per_class=2, delta=0.8, alpha=2.0, repulsion_delta=1.0
    ),
    "ContrastivePotential": lambda: losses.ContrastivePotentialLoss(
        C, D, proxies_per_class=3, delta=0.6, repulsion_delta=1.2
    ),
}


def build(case):
    """Model, loss, data and labels; identical in every process (fixed seed)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(IN_DIM, D).double()
    loss_func = CASES[case]().double()
    data = torch.randn(BATCH, IN_DIM, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 3, 3, 5, 1, 1, 2, 5, 5, 0])  # class 4 and 6 absent, 2 only on rank 1
    return model, loss_func, data, labels


def gradients(model, loss_func, embeddings):
    return {
        "model": [p.grad.clone() for p in model.parameters()],
        "loss": [p.grad.clone() for p in loss_func.parameters()],
        "embeddings": embeddings.grad.clone(),
    }


def run_case(case, rank, out_dir):
    model, loss_func, data, labels = build(case)
    model = DDP(model)
    wrapped = DistributedLossWrapper(loss_func)
    if list(loss_func.parameters()):
        wrapped = DDP(wrapped)
    local = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
    embeddings = model(data[local])
    embeddings.retain_grad()
    wrapped(embeddings, labels[local]).backward()
    torch.save(gradients(model.module, loss_func, embeddings), os.path.join(out_dir, f"{case}-{rank}.pt"))


def rank_worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    for case in CASES:
        run_case(case, rank, out_dir)
    # the DDP modules (and gloo's pending work they hold) are gone before the
    # group is: gloo work freed during interpreter shutdown aborts the process
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def distributed_gradients(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp")
    mp.spawn(rank_worker, args=(str(out_dir / "init"), str(out_dir)), nprocs=WORLD_SIZE, join=True)
    return {
        (case, rank): torch.load(out_dir / f"{case}-{rank}.pt", weights_only=True)
        for case in CASES
        for rank in range(WORLD_SIZE)
    }


@pytest.mark.parametrize("case", CASES)
def test_two_processes_match_one_process(case, distributed_gradients):
    model, loss_func, data, labels = build(case)
    embeddings = model(data)
    embeddings.retain_grad()
    loss_func(embeddings, labels).backward()
    expected = gradients(model, loss_func, embeddings)
    for rank in range(WORLD_SIZE):
        got = distributed_gradients[case, rank]
        for name in ["model", "loss"]:
            assert len(got[name]) == len(expected[name])
            for g, e in zip(got[name], expected[name]):
                torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-12)
        # each rank holds world_size x the single-process gradient of its own rows,
        # which DDP's average over the ranks turns into the single-process model gradient
        local = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
        torch.testing.assert_close(
            got["embeddings"] / WORLD_SIZE, expected["embeddings"][local], rtol=1e-6, atol=1e-12
        )

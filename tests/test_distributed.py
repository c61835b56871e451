"""Two gloo processes on CPU give the single-process gradients (float64)."""

import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pytorch_metric_learning import losses as pml_losses
from torch.nn.parallel import DistributedDataParallel as DDP

from pml_fieldlosses import losses
from pml_fieldlosses.models import RelationalEmbedder
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


def build_relational():
    """The DRML head with RelationalLoss around ProxyAnchor (float64, fixed seed)."""
    torch.manual_seed(0)
    embedder = RelationalEmbedder(IN_DIM + 3, D, num_branches=2).double()
    loss_func = losses.RelationalLoss(
        pml_losses.ProxyAnchorLoss(C, D),
        branch_losses=lambda: pml_losses.ProxyAnchorLoss(C, D // 2),
        num_branches=embedder.num_branches,
        embedding_size=D,
    ).double()
    data = torch.randn(BATCH, IN_DIM + 3, dtype=torch.float64)
    return embedder, loss_func, data, build("ClassWiseMultiSimilarity")[3]


def relational_gradients(embedder, loss_func):
    return {
        name: [p.grad.clone() for p in m.parameters()]
        for name, m in [("head", embedder), ("loss", loss_func)]
    }


def run_relational(rank, out_dir):
    """RelationalLoss per rank (not gathered): DDP around the head and around the loss.
    A branch may get no sample on a rank, hence find_unused_parameters for the loss (not
    for the head: with it DDP returns copies of the head's outputs, which have no branch
    outputs)."""
    embedder, loss_func, data, labels = build_relational()
    head, loss = DDP(embedder), DDP(loss_func, find_unused_parameters=True)
    local = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
    loss(head(data[local]), labels[local]).backward()
    torch.save(relational_gradients(embedder, loss_func), os.path.join(out_dir, f"Relational-{rank}.pt"))


def rank_worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    for case in CASES:
        run_case(case, rank, out_dir)
    run_relational(rank, out_dir)
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
        for case in [*CASES, "Relational"]
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


def test_relational_loss_per_rank_matches_the_mean_of_the_ranks_losses(distributed_gradients):
    """The DRML recipe of docs/distributed.md: each rank's RelationalLoss on its own batch;
    DDP's average gives the gradient of the mean of the per-rank losses."""
    embedder, loss_func, data, labels = build_relational()
    total = 0
    for rank in range(WORLD_SIZE):
        local = slice(rank * BATCH // WORLD_SIZE, (rank + 1) * BATCH // WORLD_SIZE)
        total = total + loss_func(embedder(data[local]), labels[local]) / WORLD_SIZE
    total.backward()
    expected = relational_gradients(embedder, loss_func)
    for rank in range(WORLD_SIZE):
        got = distributed_gradients["Relational", rank]
        for name in expected:
            assert len(got[name]) == len(expected[name])
            for g, e in zip(got[name], expected[name]):
                torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-12)

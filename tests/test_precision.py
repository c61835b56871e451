"""Mixed precision: bfloat16 autocast on CPU always, float16 autocast on CUDA when
present. Finite values and gradients, parameters kept in float32, agreement with
float32 within the documented tolerance, and many random steps without a
non-finite value."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses
from pml_fieldlosses.models import RelationalEmbedder

from .loss_registry import ALL_LOSSES

DEVICES = [("cpu", torch.bfloat16)] + ([("cuda", torch.float16)] if torch.cuda.is_available() else [])
# loss under autocast vs float32, relative (docs/robustness.md)
AUTOCAST_RTOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3}
# The potential losses are compared with their float32 value on the same rounded
# (half-precision) embeddings, not on the float32 embeddings: PFML's d^-alpha repulsion
# amplifies the rounding for nearly coincident points (up to ~100% on random data), and
# CPML's value is a small difference of large pair sums (e.g. -0.14 vs -0.18 in one
# bfloat16 batch); on the same rounded embeddings both compute the float32 value, since
# the loss runs in float32 under autocast
ON_ROUNDED_EMBEDDINGS = {"PotentialField", "ContrastivePotential"}
# Nor is the DRML head: each sample goes to the branch with the smallest reconstruction
# error, and half-precision rounding flips near-ties, which moves samples between branch
# losses (a jump, not a rounding error, e.g. 103 -> 126 in one random batch)
HEAD = "RelationalEmbedder+ProxyAnchor"
NOT_COMPARED = {HEAD}
MODELS = list(ALL_LOSSES) + [HEAD]


def build(name, num_classes, embedding_size, device):
    """A Linear embedder and the loss, or the DRML head and its loss around ProxyAnchor."""
    if name != HEAD:
        return torch.nn.Linear(16, embedding_size).to(device), ALL_LOSSES[name](
            num_classes, embedding_size
        ).to(device)
    embedder = RelationalEmbedder(16, embedding_size, num_branches=4).to(device)
    loss_func = losses.RelationalLoss(
        pml_losses.ProxyAnchorLoss(num_classes, embedding_size),
        lambda: pml_losses.ProxyAnchorLoss(num_classes, embedder.branch_size),
        num_branches=embedder.num_branches,
        embedding_size=embedding_size,
    ).to(device)
    return embedder, loss_func


def random_step(name, generator, device, dtype):
    """One random batch through the embedder and loss under autocast; returns
    the loss, the parameters (with their gradients) and the float32 loss."""
    num_classes = int(torch.randint(1, 40, (), generator=generator))
    embedding_size = 4 * int(torch.randint(1, 16, (), generator=generator))
    batch_size = int(torch.randint(1, 64, (), generator=generator))
    labels = torch.randint(0, num_classes, (batch_size,), generator=generator).to(device)
    scale = 10 ** float(torch.empty(()).uniform_(-3, 3, generator=generator))
    data = (torch.randn(batch_size, 16, generator=generator) * scale).to(device)
    embedder, loss_func = build(name, num_classes, embedding_size, device)
    reference = loss_func(embedder(data), labels)
    with torch.autocast(device, dtype=dtype):
        embeddings = embedder(data)
        loss = loss_func(embeddings, labels)
    loss.backward()
    if name in ON_ROUNDED_EMBEDDINGS:
        reference = loss_func(embeddings.detach().float(), labels)
    return loss, list(embedder.parameters()) + list(loss_func.parameters()), reference


def check_steps(name, device, dtype, steps):
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss, parameters, reference = random_step(name, generator, device, dtype)
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        for p in parameters:
            assert p.dtype == torch.float32 and (p.grad is None or torch.isfinite(p.grad).all())
        if name in ON_ROUNDED_EMBEDDINGS:
            torch.testing.assert_close(loss.detach(), reference.detach(), rtol=1e-5, atol=1e-6)
        elif name not in NOT_COMPARED:
            torch.testing.assert_close(
                loss.detach(), reference.detach(), rtol=AUTOCAST_RTOL[dtype], atol=1e-3
            )


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_autocast_random_steps(name, device, dtype):
    check_steps(name, device, dtype, steps=100)


@pytest.mark.slow
@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_autocast_10000_random_steps(name, device, dtype):
    check_steps(name, device, dtype, steps=10_000)

"""Mixed precision: bfloat16 and float16 autocast on CPU always, float16 autocast on
CUDA when present. Finite values and gradients (float16 with a GradScaler, as torch's
AMP recipe trains in it), parameters kept in float32, agreement with float32 within the
documented tolerance, many random steps without a non-finite value, and the gradient
that reaches half-precision embeddings: the float32 one in their dtype, inf where it
overflows float16, never clamped."""

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses
from pml_fieldlosses.models import RelationalEmbedder

from .loss_registry import ALL_LOSSES

DEVICES = [("cpu", torch.bfloat16), ("cpu", torch.float16)] + (
    [("cuda", torch.float16)] if torch.cuda.is_available() else []
)
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
    parameters = list(embedder.parameters()) + list(loss_func.parameters())
    reference = loss_func(embedder(data), labels)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    optimizer = torch.optim.SGD(parameters, lr=0.0)
    # float16: the gradients can exceed its range (PFML's d^-alpha repulsion between small,
    # nearly coincident embeddings reaches 1e8), so it trains with a GradScaler, which skips
    # a step whose gradients overflow and lowers its scale; redo the step until one is taken
    for _ in range(64):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype):
            embeddings = embedder(data)
            loss = loss_func(embeddings, labels)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        taken = all(p.grad is None or torch.isfinite(p.grad).all() for p in parameters)
        scaler.step(optimizer)
        scaler.update()
        if taken:
            break
    if name in ON_ROUNDED_EMBEDDINGS:
        reference = loss_func(embeddings.detach().float(), labels)
    return loss, parameters, reference


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


@pytest.mark.parametrize("device", sorted({device for device, _ in DEVICES}))
@pytest.mark.parametrize("name", ALL_LOSSES)
def test_half_embeddings_get_the_float32_gradient_in_their_dtype(name, device):
    """The loss computes in float32; the gradient that reaches float16 embeddings is the
    float32 gradient cast to float16 as torch casts, bit for bit: inf where it exceeds
    65504, so that a GradScaler sees the overflow (clamped to 65504, as it once was, the
    scaler took the step with the gradient clipped). Scales as a GradScaler applies them."""
    g = torch.Generator().manual_seed(11)
    num_classes, embedding_size, batch_size = 7, 16, 24
    loss_func = ALL_LOSSES[name](num_classes, embedding_size).to(device)
    labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
    half = (torch.randn(batch_size, embedding_size, generator=g) * 0.05).half().to(device)
    half.requires_grad_()
    full = half.detach().float().requires_grad_()
    for scale in (1.0, 2.0**16, 2.0**40):
        with torch.autocast(device, dtype=torch.float16):
            loss = loss_func(half, labels)
        (grad,) = torch.autograd.grad(loss * scale, [half])
        (expected,) = torch.autograd.grad(loss_func(full, labels) * scale, [full])
        assert grad.dtype == torch.float16 and torch.equal(grad, expected.half())
    assert torch.isinf(grad).any() and torch.isfinite(expected).all()

"""How far mixed precision moves each loss from float32.

    python benchmarks/bench_precision.py [--steps 200] [--device cuda] [--autocast float16]

For random batches (shapes, labels, input scales) through a Linear embedder,
compares the loss and the gradient (of all parameters, embedder's and loss's,
as one vector) computed with the forward pass under autocast (--autocast; none,
the default, means float16 on CUDA and bfloat16 on CPU) and the backward pass
outside it, with the float32 ones: relative deviations |mixed - float32| / |float32|, median,
95th percentile and largest over the batches (the largest comes from batches
whose float32 gradient is nearly 0, where rounding noise dominates), and the
number of batches with a non-finite value.

float16 runs as torch's AMP recipe trains in it, with a GradScaler: a step whose
gradients overflow float16 (PFML's d^-alpha repulsion between small, nearly
coincident embeddings reaches 1e8) is skipped and the scale lowered, and the
batch is redone until a step is taken; ``skipped`` counts those steps over all
batches, and the deviations are those of the step taken.
"""

import argparse
import statistics

import torch
from device import add_device_options, autocast, check_device, describe
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses
from pml_fieldlosses.app import catalog
from pml_fieldlosses.models import RelationalEmbedder

# our losses as the tests build them (pml_fieldlosses.app.catalog), and PML's ProxyAnchor
LOSSES = {
    **catalog.ours_by_class_name(mf_reg_weight=0.1),
    "ProxyAnchor (PML, for reference)": catalog.published("ProxyAnchor"),
}


def relative(a, b):
    if not b.any():
        return 0.0 if not a.any() else float("inf")
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def deviations(name, generator, args):
    device = args.device
    C = int(torch.randint(2, 60, (), generator=generator))
    D = 8 * int(torch.randint(1, 16, (), generator=generator))
    B = int(torch.randint(2, 128, (), generator=generator))
    labels = torch.randint(0, C, (B,), generator=generator).to(device)
    data = (torch.randn(B, 32, generator=generator) * 10 ** float(torch.empty(()).uniform_(-2, 2))).to(device)
    if name == "DRML head + ProxyAnchor":
        embedder = RelationalEmbedder(32, D, num_branches=4).to(device)
        loss_func = losses.RelationalLoss(
            pml_losses.ProxyAnchorLoss(C, D),
            lambda: pml_losses.ProxyAnchorLoss(C, embedder.branch_size),
            num_branches=4,
            embedding_size=D,
        )
    else:
        embedder = torch.nn.Linear(32, D).to(device)
        loss_func = LOSSES[name](C, D).to(device)
    parameters = list(embedder.parameters()) + list(loss_func.parameters())
    for p in parameters:
        p.grad = None
    reference = loss_func(embedder(data), labels)
    reference.backward()
    reference_grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters]
    # float16 trains with a GradScaler (torch's AMP recipe): a step whose gradients overflow
    # float16 is skipped and the scale lowered; the batch is redone until a step is taken.
    # PML's ProxyAnchorLoss casts its proxies to the autocast dtype, and a GradScaler refuses
    # float16 parameters: that reference row runs without one.
    scaler = torch.amp.GradScaler(torch.device(device).type, enabled=args.autocast == "float16")
    optimizer = torch.optim.SGD(parameters, lr=0.0)
    for skipped in range(64):
        optimizer.zero_grad(set_to_none=True)
        with autocast(args):
            mixed = loss_func(embedder(data), labels)
        if any(p.dtype != torch.float32 for p in parameters):
            scaler = torch.amp.GradScaler(enabled=False)
        scaler.scale(mixed).backward()
        if scaler.is_enabled():
            scaler.unscale_(optimizer)
        mixed_grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters]
        finite = bool(torch.isfinite(mixed)) and all(torch.isfinite(g).all() for g in mixed_grads)
        if finite or not scaler.is_enabled():
            break
        scaler.step(optimizer)  # skipped: the scaler found the overflow
        scaler.update()
    return (
        relative(mixed.detach(), reference.detach()),
        max(relative(g, r) for g, r in zip(mixed_grads, reference_grads)),
        finite,
        skipped,
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    add_device_options(parser)
    args = parser.parse_args()
    device = check_device(parser, args)
    if args.autocast == "none":  # this script compares mixed precision with float32
        args.autocast = "float16" if device.type == "cuda" else "bfloat16"
    print(f"{describe(args)}, {args.steps} random batches per loss, autocast against float32")
    print(f"{'':<34} {'loss deviation':^29} {'gradient deviation':^29}")
    print(
        f"{'loss':<34} {'median':>9} {'p95':>9} {'max':>9} {'median':>9} {'p95':>9} {'max':>9} {'non-finite':>10}"
        + (f" {'skipped':>8}" if args.autocast == "float16" else "")
    )
    for name in list(LOSSES) + ["DRML head + ProxyAnchor"]:
        generator = torch.Generator().manual_seed(0)
        rows = [deviations(name, generator, args) for _ in range(args.steps)]
        columns = []
        for deviation in ([r[0] for r in rows], [r[1] for r in rows]):
            columns += [
                statistics.median(deviation),
                statistics.quantiles(deviation, n=20, method="inclusive")[-1],
                max(deviation),
            ]
        print(
            f"{name:<34} "
            + " ".join(f"{c:>9.2e}" for c in columns)
            + f" {sum(not r[2] for r in rows):>10d}"
            + (f" {sum(r[3] for r in rows):>8d}" if args.autocast == "float16" else "")
        )


if __name__ == "__main__":
    main()

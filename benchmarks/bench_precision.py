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
"""

import argparse
import contextlib
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
    results = []
    for mixed in [False, True]:
        for p in parameters:
            p.grad = None
        with autocast(args) if mixed else contextlib.nullcontext():
            loss = loss_func(embedder(data), labels)
        loss.backward()
        results.append(
            (loss.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in parameters])
        )
    (reference, reference_grads), (mixed, mixed_grads) = results
    finite = bool(torch.isfinite(mixed)) and all(torch.isfinite(g).all() for g in mixed_grads)
    return (
        relative(mixed, reference),
        max(relative(g, r) for g, r in zip(mixed_grads, reference_grads)),
        finite,
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
            f"{name:<34} " + " ".join(f"{c:>9.2e}" for c in columns) + f" {sum(not r[2] for r in rows):>10d}"
        )


if __name__ == "__main__":
    main()

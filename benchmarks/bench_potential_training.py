"""Amortised cost of PotentialFieldLoss / ContrastivePotentialLoss in a simulated
training run, next to ProxyAnchorLoss, including the neighbour-list rebuilds.

    python benchmarks/bench_potential_training.py                        # SOP shape: B=256, N=11318, M=2, D=512
    python benchmarks/bench_potential_training.py --steps 20 --num-classes 1000

Every step draws a batch (B/4 classes x 4 samples) of a synthetic data set
(samples = class centre + noise, fixed inputs), embeds it with a linear trunk
(Adam, lr 5e-4) and updates the trunk and the loss's proxies (Adam, lr 5e-2 =
100x the trunk's, as in the paper). The time of the loss's forward+backward
(which includes the neighbour-list maintenance) is taken for each loss on the
same batch, interleaved in one process; each loss has its own trunk copy and
optimisers, so each sees its own training dynamics. Printed: per-step times,
then the mean and median over the steps after the first (the first call builds
the full neighbour list and is shown separately) and the ratios to
ProxyAnchorLoss, and the neighbour-list statistics.
"""

import argparse
import copy
import statistics
import time

import torch
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-classes", type=int, default=11318)
    parser.add_argument("--embedding-size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--trunk-lr", type=float, default=5e-4)
    parser.add_argument("--proxy-lr-factor", type=float, default=100.0)
    parser.add_argument("--losses", nargs="+", default=["PFML", "CPML"], choices=["PFML", "CPML"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    B, C, D = args.batch_size, args.num_classes, args.embedding_size
    g = torch.Generator().manual_seed(args.seed)
    centres = torch.randn(C, D, generator=g)
    trunk = torch.nn.Linear(D, D)

    builders = {
        "ProxyAnchor": lambda: pml_losses.ProxyAnchorLoss(C, D),
        "PFML": lambda: losses.PotentialFieldLoss(C, D),
        "CPML": lambda: losses.ContrastivePotentialLoss(C, D),
    }
    runs = {}
    for name in ["ProxyAnchor"] + args.losses:
        model = copy.deepcopy(trunk)
        loss_fn = builders[name]()
        runs[name] = dict(
            model=model,
            loss_fn=loss_fn,
            opt=torch.optim.Adam(model.parameters(), lr=args.trunk_lr),
            loss_opt=torch.optim.Adam(loss_fn.parameters(), lr=args.trunk_lr * args.proxy_lr_factor),
            times=[],
        )
    print(
        f"B={B} N={C} D={D} steps={args.steps} trunk lr={args.trunk_lr} "
        f"proxy lr={args.trunk_lr * args.proxy_lr_factor} threads={torch.get_num_threads()}"
    )
    for step in range(args.steps):
        classes = torch.randperm(C, generator=g)[: B // 4]
        labels = classes.repeat_interleave(4)
        inputs = centres[labels] + 0.5 * torch.randn(B, D, generator=g)
        line = [f"step {step:3d}"]
        for name, run in runs.items():
            embeddings = run["model"](inputs)
            run["opt"].zero_grad()
            run["loss_opt"].zero_grad()
            start = time.perf_counter()
            loss = run["loss_fn"](embeddings, labels)
            loss.backward()
            run["times"].append(time.perf_counter() - start)
            run["opt"].step()
            run["loss_opt"].step()
            extra = ""
            nl = getattr(run["loss_fn"], "neighbor_list", None)
            if nl is not None:
                extra = f" (re-anchored {nl.last_reanchored}, list {nl.pairs.shape[1]})"
            line.append(f"{name} {run['times'][-1] * 1e3:7.0f} ms{extra}")
        print("  ".join(line), flush=True)

    reference = statistics.mean(runs["ProxyAnchor"]["times"][1:])
    print(
        f"\n{'loss':<12} {'first ms':>9} {'mean ms':>9} {'median ms':>9} {'mean xPA':>9} {'median xPA':>10}"
    )
    ref_median = statistics.median(runs["ProxyAnchor"]["times"][1:])
    for name, run in runs.items():
        t = run["times"]
        mean, median = statistics.mean(t[1:]), statistics.median(t[1:])
        print(
            f"{name:<12} {t[0] * 1e3:>9.0f} {mean * 1e3:>9.0f} {median * 1e3:>9.0f} "
            f"{mean / reference:>9.2f} {median / ref_median:>10.2f}"
        )
        nl = getattr(run["loss_fn"], "neighbor_list", None)
        if nl is not None:
            print(
                f"{'':<12} neighbour list: {nl.num_builds} full builds, {nl.num_partial_rebuilds} partial "
                f"rebuilds re-anchoring {nl.num_reanchored} proxies in total, {nl.pairs.shape[1]} pairs now"
            )


if __name__ == "__main__":
    main()

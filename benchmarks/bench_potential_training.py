"""Amortised step time of PotentialFieldLoss / ContrastivePotentialLoss next to
PML's ProxyAnchorLoss along a training trajectory in which the proxies contract
(issue 16), at the start, middle and end of the run, for several numbers of
classes (M = 2 proxies per class).

    python benchmarks/bench_potential_training.py                      # N = 400, 2000, 11318
    python benchmarks/bench_potential_training.py --num-classes 400 --window 8

Data (self-contained, fixed): features = a common mean + a class centre in a
low-dimensional subspace (rank 16) + noise, as real (post-ReLU) features are,
so the embeddings of a linear trunk fill a small cone of the sphere. Training
steps draw a batch (B/4 classes x 4 samples) and update a trunk and the loss's
proxies (Adam, lr 5e-4 and 5e-2 = 100x, as in the paper); each loss has its
own trunk and optimisers and is timed on the same batches, interleaved in one
process. A real run takes thousands of steps to contract its proxies (issue
16 measured a median pairwise distance of 1.41 at the start and 0.61 at epoch
26 on 400 classes); this script gets there in seconds: before the "middle"
and "end" stages, an Adam loop pulls each normalised proxy towards its class's
embedding (the mean of the class's features through the trunk) until the
median pairwise proxy distance reaches 1.0 and then 0.61. That pull is not
training: the trainer's Adam state still holds the moments of the steps
before it, which carry every proxy by ~0.02-0.05 per step for the next ~15
steps (a transient no real run has), so each stage first runs ``--settle``
ordinary training steps (untimed; 20 by default, 0 times the transient), then
times a window of ordinary training steps. Printed per stage: the mean time
of forward + backward of the loss (neighbour list maintenance included) and
its ratio to ProxyAnchorLoss, how the proxy pairs were found at those steps
(``list``: a kept Verlet list was followed; ``dense``: a dense blocked search
at the cutoff, the list being too dense to keep; ``build``: a search of all
pairs that (re)built the list; ``all``: the loss's dense path, for point sets
this small), the skin of the last build, the median
pairwise distance of the normalised proxies (sampled), the median and 90th
percentile of the proxies' displacement per timed step, and the process's
peak memory (resident set; every scale of one invocation runs in the same
process, so it is the peak so far).
"""

import argparse
import copy
import resource
import statistics
import time

import torch
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses


def median_proxy_distance(loss_fn, generator, samples=20000):
    proxies = loss_fn.proxies
    flat = torch.nn.functional.normalize(proxies.detach().reshape(-1, proxies.shape[-1]), dim=1)
    i = torch.randint(0, len(flat), (samples,), generator=generator)
    j = torch.randint(0, len(flat), (samples,), generator=generator)
    keep = i != j
    return torch.linalg.vector_norm(flat[i[keep]] - flat[j[keep]], dim=1).median().item()


def contract(loss_fn, targets, median, generator):
    """Adam on the proxies only: pull each normalised proxy towards its class's
    target direction until the median pairwise proxy distance is <= median."""
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=0.05)
    for _ in range(500):
        if median_proxy_distance(loss_fn, generator) <= median:
            return
        optimizer.zero_grad()
        directions = torch.nn.functional.normalize(loss_fn.proxies, dim=-1)
        (directions - targets.unsqueeze(1)).pow(2).sum().backward()
        optimizer.step()


def normalised_proxies(loss_fn):
    proxies = loss_fn.proxies.detach()
    return torch.nn.functional.normalize(proxies.reshape(-1, proxies.shape[-1]), dim=1)


def peak_memory_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def training_step(runs, C, B, D_in, mean, centres, g, timed):
    """One ordinary training step of every loss on the same batch (B / 4
    classes x 4 samples); if ``timed``, records the loss's forward + backward
    time, how its proxy pairs were found and its proxies' displacements."""
    classes = torch.randperm(C, generator=g)[: B // 4]
    labels = classes.repeat_interleave(4)
    inputs = mean + centres[labels] + 0.5 * torch.randn(B, D_in, generator=g)
    for run in runs.values():
        embeddings = run["model"](inputs)
        run["opt"].zero_grad()
        run["loss_opt"].zero_grad()
        start = time.perf_counter()
        loss = run["loss_fn"](embeddings, labels)
        loss.backward()
        seconds = time.perf_counter() - start
        nl = getattr(run["loss_fn"], "neighbor_list", None)
        before = normalised_proxies(run["loss_fn"]) if nl is not None and timed else None
        run["opt"].step()
        run["loss_opt"].step()
        if not timed:
            continue
        run["times"].append(seconds)
        if nl is not None:
            run["displacements"].append(torch.linalg.vector_norm(normalised_proxies(run["loss_fn"]) - before, dim=1))
            if nl.reference is None:
                run["modes"].append("all")  # small enough for the loss's dense path
            elif nl.last_reanchored == len(nl.reference):
                run["modes"].append("build")
            else:
                run["modes"].append("list" if nl.pairs is not None else "dense")


def run_scale(args, C, g):
    B, D, D_in = args.batch_size, args.embedding_size, args.input_size
    basis = torch.randn(16, D_in, generator=g)
    centres = torch.randn(C, 16, generator=g) @ basis / 4
    mean = 3 * torch.randn(D_in, generator=g)
    trunk = torch.nn.Linear(D_in, D)
    builders = {
        "ProxyAnchor": lambda: pml_losses.ProxyAnchorLoss(C, D),
        "PFML": lambda: losses.PotentialFieldLoss(C, D, proxies_per_class=2, delta=args.delta),
        "CPML": lambda: losses.ContrastivePotentialLoss(C, D, proxies_per_class=2, delta=args.delta),
    }
    runs = {}
    for name in ["ProxyAnchor"] + args.losses:
        model, loss_fn = copy.deepcopy(trunk), builders[name]()
        runs[name] = dict(
            model=model,
            loss_fn=loss_fn,
            opt=torch.optim.Adam(model.parameters(), lr=args.trunk_lr),
            loss_opt=torch.optim.Adam(loss_fn.parameters(), lr=args.trunk_lr * args.proxy_lr_factor),
            times=[],
            modes=[],
            displacements=[],
            median=[median_proxy_distance(loss_fn, g)] if name != "ProxyAnchor" else [],
        )
    W = args.window
    for stage in range(3):
        if stage > 0:
            for name in args.losses:
                run = runs[name]
                with torch.no_grad():
                    targets = torch.nn.functional.normalize(run["model"](mean + centres), dim=1)
                contract(run["loss_fn"], targets, 1.0 if stage == 1 else 0.61, g)
            for _ in range(args.settle):
                training_step(runs, C, B, D_in, mean, centres, g, timed=False)
            for name in args.losses:
                runs[name]["median"].append(median_proxy_distance(runs[name]["loss_fn"], g))
        for _ in range(W):
            training_step(runs, C, B, D_in, mean, centres, g, timed=True)
    # the first step of the start (the first full build) is left out
    stages = {"start": slice(1, W), "middle": slice(W, 2 * W), "end": slice(2 * W, 3 * W)}
    reference = {stage: statistics.mean(runs["ProxyAnchor"]["times"][s]) for stage, s in stages.items()}
    for name, run in runs.items():
        cells = []
        for stage, s in stages.items():
            seconds = statistics.mean(run["times"][s])
            cell = f"{stage} {seconds * 1e3:6.0f} ms x{seconds / reference[stage]:5.2f}"
            if run["modes"]:
                modes = run["modes"][s]
                cell += " (" + ", ".join(f"{m} {modes.count(m)}" for m in ["list", "dense", "build", "all"] if m in modes)
                moved = torch.cat(run["displacements"][s])
                cell += f"; moves {moved.median():.4f}/{moved.quantile(0.9):.4f})"
            cells.append(cell)
        print(f"N={C:<6} {name:<12} " + " | ".join(cells), flush=True)
    for name in args.losses:
        nl = runs[name]["loss_fn"].neighbor_list
        skin = f"last skin {nl.skin:.3f} (largest {nl.max_skin:.3f})" if nl.skin is not None else "no list"
        print(
            f"N={C:<6} {name:<12} median proxy distance at the stages "
            f"{', '.join(f'{m:.2f}' for m in runs[name]['median'])}; {skin}; "
            f"peak memory so far {peak_memory_gb():.2f} GB",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-classes", type=int, nargs="+", default=[400, 2000, 11318])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--embedding-size", type=int, default=512)
    parser.add_argument("--input-size", type=int, default=256)
    parser.add_argument("--delta", type=float, default=0.4, help="the bench's PFML/CPML delta")
    parser.add_argument("--window", type=int, default=5, help="training steps per stage")
    parser.add_argument(
        "--settle",
        type=int,
        default=20,
        help="untimed training steps after each contraction (0: time the transient right after it)",
    )
    parser.add_argument(
        "--sop-window", type=int, default=None, help="training steps per stage at N >= 10000 (default: --window)"
    )
    parser.add_argument("--trunk-lr", type=float, default=5e-4)
    parser.add_argument("--proxy-lr-factor", type=float, default=100.0)
    parser.add_argument("--losses", nargs="+", default=["PFML", "CPML"], choices=["PFML", "CPML"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's; 1 on a shared, busy machine)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(
        f"B={args.batch_size} D={args.embedding_size} M=2 delta={args.delta} "
        f"steps per stage={args.window} settle={args.settle} threads={torch.get_num_threads()}",
        flush=True,
    )
    for C in args.num_classes:
        scale_args = copy.copy(args)
        if C >= 10000 and args.sop_window is not None:
            scale_args.window = args.sop_window
            print(f"N={C}: {args.sop_window} training steps per stage (--sop-window)", flush=True)
        run_scale(scale_args, C, torch.Generator().manual_seed(args.seed))


if __name__ == "__main__":
    main()

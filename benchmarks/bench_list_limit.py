"""The neighbour list's size limit, and a projection filter, tried on a saved training state.

    python benchmarks/bench_potential_training.py --num-classes 2000 --save-state n2000.pt --stop-at 2970
    python benchmarks/bench_list_limit.py n2000.pt --loss CPML            # limits x1, x2, x4, x8
    python benchmarks/bench_list_limit.py n400.pt --limits --projection-ranks 16 64 128
    python benchmarks/bench_list_limit.py n2000.pt --limits --shell
    python benchmarks/bench_list_limit.py sop.pt --loss PFML --limits 1 --products float32 bfloat16

A state written by bench_potential_training.py (``--save-state``) holds the proxies, the
optimisers, the neighbour lists and the data generator of a trajectory. From it, for each
factor of ``--limits``, a copy of the loss trains on the same batches with its neighbour list
rebuilt under a size limit that many times the default (``pair_cost`` divided by the
factor: a larger list, a larger skin), next to PML's ProxyAnchorLoss from the same state.
Printed per factor: the median forward + backward time of the steps after ``--skip`` (the
first ones include the rebuild) against ProxyAnchor's, and the means per step of the proxies
re-anchored, the distances their searches computed (as a fraction of one dense search of
all proxy pairs), the listed pairs evaluated from their coordinates and the list's size; the
last skin; then whether every factor left the same proxies bit for bit (the limit changes
the work, never the result). ``--products float32 bfloat16``: each limit with the searches'
matrix products in float32 and in bfloat16 (the same proxies bit for bit too).

``--projection-ranks K ...``: for the state's proxies, the share of the pairs of different
classes that a lower bound of their distance from a K-column principal basis (the projected
distance and the difference of the residual norms, both at most the distance) cannot put
beyond the cutoff: the pairs a projection filter would still have to evaluate, at about
``pair_cost`` matrix-product entries each (docs/performance-log.md, "The potential losses along
training").

``--shell``: how the distances of the proxy pairs of different classes lie around the cutoff
(the pairs within it, quantiles, the shares within the cutoff plus 0.02 to 0.2) and the
multiply-adds a step needs besides finding its pairs (the embeddings' distances to every
proxy, and the pairs within the cutoff, forward and backward) against ProxyAnchor's: what
the pair search costs on top is the list's measured work above.
"""

import argparse
import copy
import statistics

import torch
from bench_potential_training import (
    LOSSES,
    Data,
    Run,
    StateFileError,
    make_loss,
    normalised_proxies,
    read_state,
)
from device import add_device_options, check_device, describe
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses.losses.potential.neighbor_list import NeighborList

# --products: the losses' bfloat16_search
PRODUCTS = {"auto": None, "float32": False, "bfloat16": True}


def trajectory(state, args):
    """The saved run's settings with this run's device options, as bench_potential_training's Run
    takes them."""
    settings = dict(state["settings"])
    return argparse.Namespace(**settings, device=args.device, autocast=args.autocast)


def fresh_loss(settings, args):
    """A fresh loss of the saved run's kind ``args.loss``, shaped as bench_potential_training makes it."""
    return make_loss(args.loss, settings.num_classes, settings.embedding_size, settings.delta)


def loss_run(state, settings, args, factor, products):
    """The saved loss ``args.loss`` with its list forgotten (the next step rebuilds it), a size
    limit ``factor`` times the default and its searches' ``products`` (auto, float32 or
    bfloat16: the loss's bfloat16_search None, False or True)."""
    loss_fn = fresh_loss(settings, args)
    loss_fn.all_pairs_entries = 0  # the neighbour list at any size: what this script times
    loss_fn.bfloat16_search = PRODUCTS[products]
    trunk = torch.nn.Linear(settings.input_size, settings.embedding_size)
    run = Run(loss_fn.to(args.device), trunk.to(args.device), settings)
    # a copy: the optimisers' state tensors would otherwise be shared between the runs
    run.load(copy.deepcopy(state["runs"][args.loss]))
    run.neighbors.pair_cost = NeighborList.default_pair_cost(settings.embedding_size) / factor
    run.neighbors.reset()
    return run


def time_limits(state, settings, args):
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(settings.seed)
    data = Data(
        settings.num_classes, settings.input_size, settings.batch_size, settings.data, generator, device
    )
    generator.set_state(state["data_generator"].cpu())
    runs = {
        (factor, products): loss_run(state, settings, args, factor, products)
        for factor in args.limits
        for products in args.products
    }
    reference = Run(
        pml_losses.ProxyAnchorLoss(settings.num_classes, settings.embedding_size).to(device),
        torch.nn.Linear(settings.input_size, settings.embedding_size).to(device),
        settings,
    )
    reference.load(copy.deepcopy(state["reference"]))
    counts = {key: [] for key in runs}
    for step in range(args.steps):
        inputs, labels = data.batch()
        reference.step(inputs, labels, step, timed=True)
        for key, run in runs.items():
            run.step(inputs, labels, step, timed=True)
            nl = run.neighbors
            stats = nl.stats
            counts[key].append(
                (stats.last_reanchored, stats.last_searched, stats.last_evaluated, nl.state.pairs.shape[1])
            )
    counted = range(args.skip, args.steps)
    n = settings.num_classes * 2
    dense = n * (n - 1) / 2
    baseline = statistics.median(reference.records[step]["seconds"] for step in counted)
    print(f"{'limit':<7}{'products':<10}{'pair_cost':>10}{'ms':>9}{'x PA':>7}{'re-anchored':>13}"
          f"{'searched':>10}{'evaluated':>11}{'listed':>9}{'skin':>8}")  # fmt: skip
    for (factor, products), run in runs.items():
        seconds = statistics.median(run.records[step]["seconds"] for step in counted)
        rows = counts[factor, products][args.skip :]
        reanchored, searched, evaluated, listed = (statistics.mean(row[i] for row in rows) for i in range(4))
        print(
            f"x{factor:<6g}{products:<10}{run.neighbors.pair_cost:>10.1f}{1000 * seconds:>9.1f}"
            f"{seconds / baseline:>7.2f}{reanchored:>13.0f}{searched / dense:>10.3f}{evaluated:>11.0f}"
            f"{listed:>9.0f}{run.neighbors.state.skin:>8.3f}"
        )
    first, *others = (run.loss_fn.proxies for run in runs.values())
    same = all(torch.equal(first, other) for other in others)
    print(
        f"the same proxies after {args.steps} steps for every limit and products: {'yes' if same else 'NO'}"
    )


def pair_blocks(groups, block_rows=1024):
    """Blocks of rows, each with the mask of its pairs (i < j) of points of different groups."""
    index = torch.arange(len(groups))
    for start in range(0, len(groups), block_rows):
        rows = slice(start, start + block_rows)
        different = groups[rows].unsqueeze(1) != groups.unsqueeze(0)
        yield rows, different & (index[rows].unsqueeze(1) < index.unsqueeze(0))


def pair_distances(points, groups):
    """The distances of the pairs (i < j) of points of different groups, block by block."""
    for rows, mask in pair_blocks(groups):
        yield torch.cdist(points[rows], points)[mask]


def saved_points(state, settings, args):
    """The saved loss's normalised proxies (float64, on the CPU), their classes and the cutoff
    of the repulsion between classes."""
    loss_fn = fresh_loss(settings, args)
    loss_fn.load_state_dict(state["runs"][args.loss]["loss"])
    points = normalised_proxies(loss_fn).double().cpu()
    groups = torch.arange(len(points)) // loss_fn.proxies_per_class
    return points, groups, settings.delta  # repulsion_delta defaults to delta


def distance_shell(state, settings, args, bins=2000):
    """How the distances of the pairs of different classes lie around the cutoff, and the
    multiply-adds a step needs besides finding its pairs, against ProxyAnchor's."""
    points, groups, cutoff = saved_points(state, settings, args)
    margins = (0.02, 0.05, 0.1, 0.2)
    histogram = torch.zeros(bins, dtype=torch.float64)  # [0, 2]: unit vectors
    pairs = within = 0
    near = [0] * len(margins)
    for distances in pair_distances(points, groups):
        pairs += distances.numel()
        within += int((distances < cutoff).sum())
        near = [count + int((distances < cutoff + m).sum()) for count, m in zip(near, margins)]
        histogram += torch.histc(distances, bins=bins, min=0.0, max=2.0)
    cumulative = histogram.cumsum(0) / pairs
    levels = (1e-4, 1e-3, 1e-2, 0.1, 0.5)
    quantiles = [2.0 * (int(torch.searchsorted(cumulative, q)) + 1) / bins for q in levels]
    print(
        f"pair distances, {len(points)} proxies: {pairs} pairs of different classes, "
        f"{within} within the cutoff {cutoff}"
    )
    cells = [f"{100 * q:g}% {x:.3f}" for q, x in zip(levels, quantiles)]
    print("their quantiles (to 0.001): " + ", ".join(cells))
    print("within the cutoff + " + " / ".join(f"{m:g}" for m in margins) + ": "
          + " / ".join(f"{100 * count / pairs:.2f}%" for count in near))  # fmt: skip
    B, D, C = settings.batch_size, settings.embedding_size, settings.num_classes
    # the embeddings' distances to every proxy; the pairs within the cutoff, forward and backward
    needed = B * len(points) * D + 3 * D * within
    proxy_anchor = 3 * B * C * D  # its cosines, forward and backward
    print(
        f"multiply-adds per step besides the pair search: {B}·{len(points)}·{D} embedding-proxy distances "
        f"+ 3·{D} per pair within the cutoff = {needed / 1e6:.0f} M, {needed / proxy_anchor:.2f}x "
        f"ProxyAnchor's 3·{B}·{C}·{D} = {proxy_anchor / 1e6:.0f} M"
    )


def projection_survivors(state, settings, args):
    """The share of the pairs of different classes whose projection lower bound is below the
    cutoff, for each rank of ``--projection-ranks`` (in float64, in blocks of rows)."""
    points, groups, cutoff = saved_points(state, settings, args)
    _, singular_values, basis = torch.linalg.svd(points - points.mean(dim=0), full_matrices=False)
    explained = singular_values.square().cumsum(0) / singular_values.square().sum()
    pairs = within = 0
    for distances in pair_distances(points, groups):
        pairs += distances.numel()
        within += int((distances < cutoff).sum())
    print(
        f"projection bound, {len(points)} proxies: {pairs} pairs of different classes, "
        f"{within} within the cutoff {cutoff}"
    )
    print(f"{'rank':<6}{'variance':>10}{'left by the bound':>19}")
    for rank in args.projection_ranks:
        projected = points @ basis[:rank].T
        residual = torch.linalg.vector_norm(points - projected @ basis[:rank], dim=1)
        left = 0
        for rows, mask in pair_blocks(groups):
            bound = (
                torch.cdist(projected[rows], projected).square()
                + (residual[rows].unsqueeze(1) - residual.unsqueeze(0)).square()
            )
            left += int((mask & (bound < cutoff**2)).sum())
        share = explained[min(rank, len(explained)) - 1].item()
        print(f"{rank:<6}{share:>10.3f}{100 * left / pairs:>18.1f}%")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("state", help="a state written by bench_potential_training.py --save-state")
    parser.add_argument("--loss", choices=list(LOSSES), default="CPML")
    parser.add_argument(
        "--limits", type=float, nargs="*", default=[1, 2, 4, 8],
        help="size limits of the list, in units of the default (none: skip the timing)",
    )  # fmt: skip
    parser.add_argument(
        "--products", nargs="+", choices=list(PRODUCTS), default=["auto"],
        help="the searches' matrix products, each timed (auto: bfloat16 where they pay on this CPU)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=40, help="steps trained from the state")
    parser.add_argument("--skip", type=int, default=5, help="first steps not counted (the rebuild)")
    parser.add_argument("--projection-ranks", type=int, nargs="*", default=[], metavar="K")
    parser.add_argument("--shell", action="store_true", help="the pairs' distances around the cutoff")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    add_device_options(parser)
    args = parser.parse_args()
    check_device(parser, args)
    if any(factor <= 0 for factor in args.limits):
        parser.error("--limits must be positive")
    if not 0 <= args.skip < args.steps:
        parser.error("--skip must be at least 0 and below --steps")
    if any(rank < 1 for rank in args.projection_ranks):
        parser.error("--projection-ranks must be positive")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        state = read_state(args.state, None, torch.device(args.device), argument="state")
    except StateFileError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if args.loss not in state["runs"]:
        parser.error(f"{args.state} holds no {args.loss} run (it has {', '.join(sorted(state['runs']))})")
    settings = trajectory(state, args)
    print(
        f"{args.state}: step {state['step']}, N={settings.num_classes} {args.loss}, B={settings.batch_size} "
        f"D={settings.embedding_size}, data={settings.data}; {describe(args)}",
        flush=True,
    )
    if args.limits:
        print(f"{args.steps} steps from the state, the first {args.skip} not counted", flush=True)
        time_limits(state, settings, args)
    if args.shell:
        distance_shell(state, settings, args)
    if args.projection_ranks:
        projection_survivors(state, settings, args)


if __name__ == "__main__":
    main()

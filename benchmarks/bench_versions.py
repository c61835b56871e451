"""This checkout's potential losses against another version's, in one process.

    python benchmarks/bench_versions.py --other ../an-older-checkout
    python benchmarks/bench_versions.py --other ../an-older-checkout --num-classes 2000 --states 1 300 2970
    python benchmarks/bench_versions.py --other ../an-older-checkout --load-state sop.pt --states 0 100

A speed change of a few percent is below the spread of separate runs of
``bench_potential_training.py`` (about +-0.1 in its ratios on a 2-core machine).
Here both versions train on the same states and batches, step by step in turn,
so what the machine does meanwhile weighs on both alike. ``--other`` is a
directory holding another version's ``pml_fieldlosses`` package (a checkout or
``git worktree`` of another commit); it is imported under another name beside
this checkout's.

The run trains ``bench_potential_training.py``'s setting (its data, trunk,
optimisers and learning rates) with this version for the largest of
``--states`` steps. At each of them, for each loss, the other version gets a
copy of the trunk, the proxies, the optimisers' states and the neighbour list
where it stands (the other version must keep the list's fields, as the versions
of this project's recent history do), and ProxyAnchorLoss the same. Then
``--passes`` passes over the same ``--window`` batches train all three, each
step timed (the loss's forward and backward, as ``bench_potential_training.py``
times them) in turn; the first pass warms up (kernels for new shapes, buffers)
and is not counted. Printed per state and loss: the median step
of each, the ratios to ProxyAnchorLoss, this version's step over the other's,
and whether both gave the same loss at every step (exact losses: they must).

``--load-state PATH`` starts from a state saved by ``bench_potential_training.py
--save-state`` (the end of a long SOP-scale run, say): its settings (classes,
data, sizes, learning rates, seed) replace those options, the losses compared
are those it holds, and ``--states`` counts the training steps after it.
"""

import argparse
import copy
import importlib.util
import statistics
import sys
from pathlib import Path

import torch
from bench_potential_training import (
    DATA,
    LOSSES,
    TRAJECTORY_SETTINGS,
    Data,
    Run,
    StateFileError,
    make_loss,
    read_state,
)
from device import add_device_options, check_device
from pytorch_metric_learning import losses as pml_losses


# what a state loaded with --load-state sets: its trajectory's settings, but those of the windows
STATE_SETTINGS = ["num_classes"] + [
    key for key in TRAJECTORY_SETTINGS if key not in ("steps", "window", "middle_median")
]


def load_other(parser, folder):
    """The ``pml_fieldlosses`` package in ``folder``, imported as ``pml_fieldlosses_other``."""
    init = Path(folder) / "pml_fieldlosses" / "__init__.py"
    if not init.is_file():
        parser.error(f"argument --other: {folder} holds no pml_fieldlosses package (no {init})")
    spec = importlib.util.spec_from_file_location(
        "pml_fieldlosses_other", init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def copy_run(run, loss_fn, args):
    """A Run of ``loss_fn`` with ``run``'s trunk, proxies and optimiser states, and its
    neighbour list where it stands (copies): the list is a cache, but its history (kept or
    not, its skin, the speed measured, and for few points whether it is followed) decides the
    work of the next steps."""
    loss_fn.load_state_dict(run.loss_fn.state_dict())
    for name in ("state", "motion", "stats", "dense_choice"):
        setattr(loss_fn.neighbor_list, name, copy.deepcopy(getattr(run.loss_fn.neighbor_list, name)))
    loss_fn._bfloat16_choice = copy.deepcopy(run.loss_fn._bfloat16_choice)
    if hasattr(loss_fn, "_list_choice"):  # (for few points: the list or all pairs; not in older versions)
        loss_fn._list_choice = copy.deepcopy(run.loss_fn._list_choice)
    other = Run(loss_fn.to(run.device), copy.deepcopy(run.trunk), args)
    other.optimizer.load_state_dict(copy.deepcopy(run.optimizer.state_dict()))
    other.loss_optimizer.load_state_dict(copy.deepcopy(run.loss_optimizer.state_dict()))
    return other


def compare(runs, batches, passes):
    """Median step (ms) of each run over ``passes`` passes but the first (Run.step's time of
    the loss's forward and backward), and whether the two versions gave the same loss at
    every step."""
    same, step = True, 0
    for turn in range(passes):
        for index, (inputs, labels) in enumerate(batches):
            # the two versions first and second in turn, each batch in either order as often (the
            # one after ProxyAnchor ran faster, by 2-4 % when both were the same code)
            first = (index + turn) % 2
            order = ["proxy_anchor", "this", "other"] if first else ["proxy_anchor", "other", "this"]
            values = {name: runs[name].step(inputs, labels, step, timed=True) for name in order}
            same &= values["this"].item() == values["other"].item()
            step += 1
    first_timed = len(batches)  # the first pass warms up
    return {
        name: 1e3 * statistics.median(run.records[s]["seconds"] for s in range(first_timed, step))
        for name, run in runs.items()
    }, same


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--other", required=True, metavar="FOLDER", help="a checkout of another version")
    parser.add_argument("--num-classes", type=int, default=400)
    parser.add_argument(
        "--states", type=int, nargs="+", default=[1, 75, 1500], help="training steps before each comparison"
    )
    parser.add_argument("--window", type=int, default=20, help="batches per pass")
    parser.add_argument("--passes", type=int, default=6, help="passes over them (the first is not counted)")
    parser.add_argument("--losses", nargs="+", default=["PFML", "CPML"], choices=sorted(LOSSES))
    parser.add_argument("--data", choices=sorted(DATA), default="hard")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--embedding-size", type=int, default=512)
    parser.add_argument("--input-size", type=int, default=256)
    parser.add_argument("--delta", type=float, default=0.4)
    parser.add_argument("--trunk-lr", type=float, default=5e-4)
    parser.add_argument("--proxy-lr-factor", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--load-state",
        metavar="PATH",
        help="start from a state saved by bench_potential_training.py --save-state (its settings apply)",
    )
    add_device_options(parser)
    args = parser.parse_args()
    device = check_device(parser, args)
    if args.autocast != "none":
        parser.error("argument --autocast: this comparison times float32 steps only")
    for option in ("num_classes", "window", "passes", "batch_size", "embedding_size", "input_size"):
        if getattr(args, option) < 1 or (option == "passes" and args.passes < 2):
            parser.error(f"argument --{option.replace('_', '-')}: too small")
    if min(args.states) < 0:
        parser.error("argument --states: a number of training steps is >= 0")
    other = load_other(parser, args.other)
    if args.threads:
        torch.set_num_threads(args.threads)
    saved = None
    if args.load_state:
        try:
            saved = read_state(args.load_state, None, device)
        except StateFileError as error:
            parser.error(str(error))
        for key in STATE_SETTINGS:
            setattr(args, key, saved["settings"][key])
    torch.manual_seed(args.seed)
    C, D = args.num_classes, args.embedding_size
    data = Data(
        C, args.input_size, args.batch_size, args.data, torch.Generator().manual_seed(args.seed), device
    )
    trunk = torch.nn.Linear(args.input_size, D).to(device)
    runs = {
        name: Run(
            make_loss(name, C, D, args.delta).to(device),
            copy.deepcopy(trunk),
            args,
        )
        for name in args.losses
    }
    if saved is not None:
        data.generator.set_state(saved["data_generator"].cpu())
        torch.set_rng_state(saved["torch_rng"].cpu())
        for name, run in runs.items():
            run.load(saved["runs"][name])
        print(f"from {args.load_state}: step {saved['step']} of its trajectory", flush=True)
    print(f"device={device} threads={torch.get_num_threads()} N={C}; other: {args.other}", flush=True)
    step = 0
    for state in sorted(set(args.states)):
        while step < state:
            inputs, labels = data.batch()
            for run in runs.values():
                run.step(inputs, labels, step, False)
            step += 1
        batches = [data.batch() for _ in range(args.window)]
        for name, run in runs.items():
            trio = {
                "proxy_anchor": Run(
                    pml_losses.ProxyAnchorLoss(C, D).to(device), copy.deepcopy(run.trunk), args
                ),
                "this": copy_run(run, make_loss(name, C, D, args.delta), args),
                "other": copy_run(run, make_loss(name, C, D, args.delta, package=other.losses), args),
            }
            ms, same = compare(trio, batches, args.passes)
            pa = ms["proxy_anchor"]
            print(
                f"N={C:<6} {name} after {state:>5} steps: ProxyAnchor {pa:6.2f} ms | this {ms['this']:6.2f} ms "
                f"x{ms['this'] / pa:.3f} | other {ms['other']:6.2f} ms x{ms['other'] / pa:.3f} | "
                f"this/other {ms['this'] / ms['other']:.3f} | same losses: {'yes' if same else 'NO'}",
                flush=True,
            )


if __name__ == "__main__":
    main()

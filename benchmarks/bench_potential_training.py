"""Step time of PotentialFieldLoss / ContrastivePotentialLoss next to PML's
ProxyAnchorLoss along real training trajectories, in which the proxies
contract (as on real data, docs/losses.md): at the start, middle and end of a run, for several numbers
of classes (M = 2 proxies per class).

    python benchmarks/bench_potential_training.py                       # N = 400, 2000 (~6 min on 2 cores)
    python benchmarks/bench_potential_training.py --num-classes 11318   # SOP scale (about an hour per loss on 2 cores)
    python benchmarks/bench_potential_training.py --num-classes 400 --data easy --steps 1500
    python benchmarks/bench_potential_training.py --num-classes 11318 --device cuda --autocast float16
    python benchmarks/bench_potential_training.py --bfloat16-search no  # float32 searches, as on CPUs without bfloat16
    python benchmarks/bench_potential_training.py --num-classes 400 --step-times   # each window's steps too
    # a long run in parts: the state is saved at every tenth of the run, and a later run goes on from it
    python benchmarks/bench_potential_training.py --num-classes 11318 --save-state sop.pt --stop-at 5000
    python benchmarks/bench_potential_training.py --num-classes 11318 --load-state sop.pt --save-state sop.pt

Every step is an ordinary training step: nothing moves the proxies but the
loss's own optimiser, from their random start until they have contracted
(their median pairwise distance falls from 1.41 to 0.6-0.8, as in the
real glyph run of docs/losses.md). Data (self-contained, fixed): features = a common mean + a class
centre in a low-dimensional subspace (rank 16) + noise, as real (post-ReLU)
features are, through a linear trunk, so the embeddings fill a small cone of
the sphere. ``--data hard`` (default): classes overlap (centres 1/8 apart,
noise 1.0) and 10 % of the training labels are wrong, so the loss never runs
out of violated pairs and the contracted proxies keep moving, pressed
against each other's repulsion radius (the costly case for an exact
method); ``--data easy``: well separated classes (centres 1/4 apart, noise
0.5, clean labels), whose proxies come to rest once every pair is on its
plateau. Each step draws a batch (B/4 classes x 4 samples) and updates a
trunk and the loss's proxies (Adam, lr 5e-4 and 5e-2 = 100x, as in the
paper); each potential loss has its own trunk and optimisers. ProxyAnchorLoss
(its own trunk and proxies) is timed on the same batches in the timed windows
only: its cost does not depend on where its proxies are.

Timed windows, per loss: ``--window`` steps at the start (after the first
step, the first full search), in the middle (from the first check, every
hundredth of the run, at which the loss's median pairwise proxy distance is
at most ``--middle-median``: while its proxies contract) and at the end of
``--steps`` training steps. Printed per stage: the mean time of forward +
backward of the loss (neighbour list maintenance included), ProxyAnchorLoss's
on the same batches and the ratio, how the proxy pairs were found at those
steps (``list``: a kept Verlet list was followed; ``dense``: a dense blocked
search at the cutoff; ``build``: a search of all pairs that (re)built the
list; ``all``: every pair at once, by the loss's dense path or its search of
all pairs, for point sets this small), the proxy-pair work per step as a
fraction of one dense search of all pairs (entries searched plus pair_cost per
pair evaluated from coordinates), the
median pairwise distance of the normalised proxies, the median and 90th
percentile of the proxies' displacement per step, the window's first step,
and the process's peak memory (resident set; the
scales of one invocation run in the same process, so it is the peak so far;
on CUDA also the GPU's, torch.cuda.max_memory_allocated).

``--device`` and ``--autocast`` (benchmarks/device.py): the trunks, losses and
batches live on that device (the batches are drawn on the CPU, so every device
trains on the same data), every clock read waits for the device, and under
``--autocast`` the trunk's and the loss's forward passes run in torch.autocast.

``--bfloat16-search``: the losses' searches on a CPU multiply float32 points in
bfloat16 where that pays on the CPU (``auto``, the losses' default, measured
once per process and printed in the header), always (``yes``) or never (``no``:
float32 products, the path of a CPU without bfloat16 instructions, so that its
cost can be measured on any CPU). The losses are the same bit for bit either way.

``--save-state PATH`` writes the whole trajectory (step, trunks, proxies,
optimiser states, random number generators, the windows timed so far and the
neighbour lists, a cache kept so that a resumed run's first steps cost what
they would have) at every tenth of the run and when it stops (``--stop-at``);
``--load-state PATH`` goes on from such a file, with the same settings (one
scale per run; the device may differ), so the later windows of a long run can
be timed without rerunning its start.
"""

import argparse
import copy
import dataclasses
import resource
import statistics

import torch
from device import add_device_options, autocast, check_device, clock, describe
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses
from pml_fieldlosses.app.errors import FileFault, atomic_write
from pml_fieldlosses.losses.potential.distances import bfloat16_products_pay
from pml_fieldlosses.losses.potential.neighbor_list import ListState, Motion, NeighborList
from pml_fieldlosses.losses.potential.pair_search import SearchStats

DATA = {
    "hard": {"centre_scale": 1 / 8, "noise": 1.0, "label_noise": 0.1},
    "easy": {"centre_scale": 1 / 4, "noise": 0.5, "label_noise": 0.0},
}
# the potential losses the trajectories train, by the name the options take
LOSSES = {"PFML": losses.PotentialFieldLoss, "CPML": losses.ContrastivePotentialLoss}
# training steps per scale: enough for the proxies to contract on the hard data
DEFAULT_STEPS = {400: 1500, 2000: 3000, 11318: 16000}
# --bfloat16-search: the losses' bfloat16_search (None: bfloat16 products where they pay on this CPU)
BFLOAT16_SEARCH = {"auto": None, "yes": True, "no": False}


def make_loss(name, num_classes, embedding_size, delta, package=losses, bfloat16_search=None):
    """The potential loss ``name`` (LOSSES) as the trajectories train it: M = 2 proxies per
    class. ``package``: the ``losses`` module to take its class from (another version's, in
    bench_versions.py). ``bfloat16_search``: the loss's setting of that name if not None
    (True: its searches multiply in bfloat16 wherever the points are float32 on a CPU;
    False: in float32, as on a CPU where bfloat16 products do not pay)."""
    loss_class = getattr(package, LOSSES[name].__name__)
    loss_fn = loss_class(num_classes, embedding_size, proxies_per_class=2, delta=delta)
    if bfloat16_search is not None:
        loss_fn.bfloat16_search = bfloat16_search
    return loss_fn


def default_steps(num_classes):
    known = [n for n in sorted(DEFAULT_STEPS) if n >= num_classes]
    return DEFAULT_STEPS[known[0]] if known else DEFAULT_STEPS[max(DEFAULT_STEPS)]


def normalised_proxies(loss_fn):
    """The proxies as the loss sees them (its proxy_points), one row each."""
    proxies = loss_fn.proxies.detach()
    return loss_fn.proxy_points(proxies.reshape(-1, proxies.shape[-1]))


def median_proxy_distance(loss_fn, samples=20000):
    flat = normalised_proxies(loss_fn)
    generator = torch.Generator().manual_seed(0)
    i = torch.randint(0, len(flat), (samples,), generator=generator).to(flat.device)
    j = torch.randint(0, len(flat), (samples,), generator=generator).to(flat.device)
    keep = i != j
    return torch.linalg.vector_norm(flat[i[keep]] - flat[j[keep]], dim=1).median().item()


def peak_memory(device):
    """The process's peak resident memory in GB, and on CUDA the GPU's peak allocated memory."""
    text = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB"  # kB on Linux
    if device.type == "cuda":
        text += f" (GPU {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GB)"
    return text


class Data:
    """Synthetic class-structured features and the batches drawn from them (on the CPU, with
    ``generator``, then moved to ``device``: every device trains on the same batches)."""

    def __init__(self, num_classes, input_size, batch_size, kind, generator, device):
        settings = DATA[kind]
        basis = torch.randn(16, input_size, generator=generator)
        self.centres = torch.randn(num_classes, 16, generator=generator) @ basis * settings["centre_scale"]
        self.mean = 3 * torch.randn(input_size, generator=generator)
        self.noise, self.label_noise = settings["noise"], settings["label_noise"]
        self.num_classes, self.batch_size, self.generator = num_classes, batch_size, generator
        self.device = device

    def batch(self):
        g = self.generator
        classes = torch.randperm(self.num_classes, generator=g)[: self.batch_size // 4]
        labels = classes.repeat_interleave(4)
        inputs = (
            self.mean
            + self.centres[labels]
            + self.noise * torch.randn(len(labels), len(self.mean), generator=g)
        )
        wrong = torch.rand(len(labels), generator=g) < self.label_noise
        labels = torch.where(wrong, torch.randint(0, self.num_classes, (len(labels),), generator=g), labels)
        return inputs.to(self.device), labels.to(self.device)


class Run:
    """One loss with its own trunk and optimisers, what its timed steps measured
    ({step: record}), and its stage windows ({stage: (first step, length)})."""

    def __init__(self, loss_fn, trunk, args):
        self.loss_fn, self.trunk, self.args = loss_fn, trunk, args
        self.device = torch.device(args.device)
        self.optimizer = torch.optim.Adam(trunk.parameters(), lr=args.trunk_lr)
        self.loss_optimizer = torch.optim.Adam(loss_fn.parameters(), lr=args.trunk_lr * args.proxy_lr_factor)
        self.neighbors = getattr(loss_fn, "neighbor_list", None)
        self.records, self.windows, self.medians = {}, {}, {}

    def step(self, inputs, labels, step, timed):
        """One training step; if ``timed``, records the loss's forward + backward
        time, how its proxy pairs were found and its proxies' displacements. Returns the
        loss (detached)."""
        self.optimizer.zero_grad()
        self.loss_optimizer.zero_grad()
        with autocast(self.args):
            embeddings = self.trunk(inputs)
        start = clock(self.device)
        with autocast(self.args):
            loss = self.loss_fn(embeddings, labels)
        loss.backward()
        seconds = clock(self.device) - start
        before = normalised_proxies(self.loss_fn) if timed and self.neighbors is not None else None
        self.optimizer.step()
        self.loss_optimizer.step()
        if timed:
            record = {"seconds": seconds}
            if self.neighbors is not None:
                moves = torch.linalg.vector_norm(normalised_proxies(self.loss_fn) - before, dim=1)
                # as Python numbers: a small tensor kept from every timed step would be allocated
                # among the loss's freed temporaries and pin the C allocator's heap, which then
                # grows (fresh pages, page faults) at the next steps of the losses whose
                # temporaries change size from step to step
                record.update(moves=moves.tolist(), mode=self.mode(), work=self.proxy_pair_work())
            self.records[step] = record
        return loss.detach()

    def timed(self, step):
        return any(first <= step < first + length for first, length in self.windows.values())

    def open_window(self, stage, step, length):
        """The stage's timed window starts at ``step``; its median proxy distance is taken now."""
        self.windows[stage] = (step, length)
        self.medians[stage] = median_proxy_distance(self.loss_fn)

    def window_steps(self, stage):
        first, length = self.windows[stage]
        return range(first, first + length)

    def mode(self):
        nl = self.neighbors
        if nl.state is None:
            return "all"  # small enough for the loss's dense path or its search of all pairs
        if nl.stats.last_reanchored == len(nl.state.reference):
            return "build"
        return "list" if nl.state.kept else "dense"

    def proxy_pair_work(self):
        """The last step's proxy-pair work as a fraction of one dense search."""
        nl = self.neighbors
        if nl.state is None:
            return 1.0
        n, dim = nl.state.reference.shape
        pair_cost = nl.pair_cost if nl.pair_cost is not None else NeighborList.default_pair_cost(dim)
        return (nl.stats.last_searched + pair_cost * nl.stats.last_evaluated) / (n * (n - 1) / 2)

    def stage_cell(self, stage, reference):
        """The printed cell of one stage: time, ProxyAnchor's (``reference``) in
        the same window and the ratio, modes, work, median distance,
        displacements, first step."""
        steps = self.window_steps(stage)
        window = [self.records[step] for step in steps]
        ms = 1e3 * statistics.mean(r["seconds"] for r in window)
        reference_ms = 1e3 * statistics.mean(reference.records[step]["seconds"] for step in steps)
        modes = [r["mode"] for r in window]
        moved = torch.cat([torch.as_tensor(r["moves"], dtype=torch.float32) for r in window])
        return (
            f"{stage} {ms:6.0f} ms vs {reference_ms:5.0f} ms x{ms / reference_ms:5.2f} ("
            + ", ".join(f"{m} {modes.count(m)}" for m in ["list", "dense", "build", "all"] if m in modes)
            + f"; work {statistics.mean(r['work'] for r in window):.3f}; median {self.medians[stage]:.2f}"
            + f"; moves {moved.median():.4f}/{moved.quantile(0.9):.4f}; step {steps[0]})"
        )

    def step_times(self, stage, reference):
        """Each step of one stage's window: its number, the loss's time and ProxyAnchor's
        (``reference``) on the same batch, in ms."""
        return " ".join(
            f"{step}:{1e3 * self.records[step]['seconds']:.1f}/{1e3 * reference.records[step]['seconds']:.1f}"
            for step in self.window_steps(stage)
        )

    def state(self):
        """Everything a resumed run needs (tensors, numbers, strings: loadable with weights_only)."""
        # (for few points: whether the neighbour list is followed, and its last work; plain fields)
        choice = getattr(self.loss_fn, "_list_choice", None)
        return {
            "trunk": self.trunk.state_dict(),
            "loss": self.loss_fn.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "loss_optimizer": self.loss_optimizer.state_dict(),
            "records": self.records,
            "windows": self.windows,
            "medians": self.medians,
            "neighbors": neighbor_list_state(self.neighbors),
            "list_choice": None if choice is None else dict(vars(choice)),
        }

    def load(self, state):
        self.trunk.load_state_dict(state["trunk"])
        self.loss_fn.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loss_optimizer.load_state_dict(state["loss_optimizer"])
        self.records, self.medians = state["records"], state["medians"]
        self.windows = {stage: tuple(window) for stage, window in state["windows"].items()}
        load_neighbor_list(self.neighbors, state["neighbors"])
        if state.get("list_choice") is not None:  # (None for ProxyAnchorLoss's run)
            vars(self.loss_fn._list_choice).update(state["list_choice"])


def neighbor_list_state(nl):
    """The neighbour list as plain fields (it is a cache: a resumed run with a fresh list gives
    the same results, but its first steps would cost a build)."""
    if nl is None or nl.state is None:
        return None
    return {
        "state": dataclasses.asdict(nl.state),
        "motion": dataclasses.asdict(nl.motion),
        "stats": dataclasses.asdict(nl.stats),
    }


def load_neighbor_list(nl, fields):
    if nl is None or fields is None:
        return
    nl.state = ListState(**fields["state"])
    nl.motion = Motion(**fields["motion"])
    nl.stats = SearchStats(**fields["stats"])


# the settings a saved state must share with the run that loads it
TRAJECTORY_SETTINGS = [
    "steps",
    "window",
    "middle_median",
    "data",
    "batch_size",
    "embedding_size",
    "input_size",
    "delta",
    "trunk_lr",
    "proxy_lr_factor",
    "losses",
    "seed",
]
STATE_NAME = "bench_potential_training state"
# (2: the neighbour list's state gained a field; a state of format 1 is refused by name)
STATE_FORMAT = f"{STATE_NAME} 2"


class StateFileError(Exception):
    """A saved state that cannot be read or does not fit this run (the message names it)."""


def save_state(path, settings, step, data, runs, reference):
    """Writes the trajectory after ``step`` steps to ``path``, whole or not at all (the project's
    atomic_write: a temporary file beside it, then a rename; a file-system fault is named)."""
    state = {
        "format": STATE_FORMAT,
        "settings": settings,
        "step": step,
        "data_generator": data.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "runs": {name: run.state() for name, run in runs.items()},
        "reference": reference.state(),
    }
    with atomic_write(path, "wb", doing="saving the trajectory state") as f:
        torch.save(state, f)


def read_state(path, settings, device, argument="--load-state"):
    """The saved state at ``path``, checked against this run's ``settings`` (None: any run's);
    errors name the command-line ``argument`` that gave the path."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except OSError as error:
        raise StateFileError(f"{argument} {path}: cannot read it ({error.strerror or error})") from None
    except Exception as error:  # noqa: BLE001 (a damaged or foreign file: torch raises many kinds)
        raise StateFileError(
            f"{argument} {path}: not a saved trajectory state ({str(error).splitlines()[0]})"
        ) from None
    saved_format = state.get("format") if isinstance(state, dict) else None
    if not (isinstance(saved_format, str) and saved_format.startswith(STATE_NAME)):
        raise StateFileError(f"{argument} {path}: not a saved trajectory state of this script")
    if saved_format != STATE_FORMAT:
        raise StateFileError(
            f"{argument} {path}: saved by another version of this script ({saved_format!r}; "
            f"this one reads {STATE_FORMAT!r}): run the trajectory again"
        )
    try:
        saved, step = state["settings"], int(state["step"])
        runs = state["runs"]
        if not all(isinstance(run, dict) for run in [*runs.values(), state["reference"]]):
            raise TypeError("runs")
        if settings is None:
            settings = {key: saved[key] for key in [*TRAJECTORY_SETTINGS, "num_classes"]}
    except (KeyError, TypeError, ValueError) as error:
        raise StateFileError(f"{argument} {path}: incomplete state ({error!r} missing)") from None
    different = [
        f"--{key.replace('_', '-')} {saved.get(key)!r} (this run: {value!r})"
        for key, value in settings.items()
        if saved.get(key) != value
    ]
    if different:
        raise StateFileError(f"{argument} {path} was saved with other settings: " + ", ".join(different))
    if not 0 < step <= settings["steps"] or sorted(runs) != sorted(settings["losses"]):
        raise StateFileError(f"{argument} {path}: its step {step} or losses do not fit this run")
    return state


def run_scale(args, C, g):
    """Train every loss on the same batches for ``steps`` steps; each loss's
    windows: the start (after the first step), the middle (from the first
    check at which its median proxy distance is at most ``--middle-median``,
    i.e. while they contract; at the latest so that it ends before the end
    window) and the end. ProxyAnchor is timed at every step of any window."""
    B, D, D_in = args.batch_size, args.embedding_size, args.input_size
    device = torch.device(args.device)
    steps = args.steps or default_steps(C)
    W = min(args.window, (steps - 1) // 3)  # three windows after the first step
    data = Data(C, D_in, B, args.data, g, device)
    trunk = torch.nn.Linear(D_in, D)
    bfloat16_search = BFLOAT16_SEARCH[args.bfloat16_search]
    runs = {
        name: Run(
            make_loss(name, C, D, args.delta, bfloat16_search=bfloat16_search).to(device),
            copy.deepcopy(trunk).to(device),
            args,
        )
        for name in args.losses
    }
    reference = Run(pml_losses.ProxyAnchorLoss(C, D).to(device), copy.deepcopy(trunk).to(device), args)
    settings = {key: getattr(args, key) for key in TRAJECTORY_SETTINGS}
    settings.update(num_classes=C, steps=steps)
    first_step = 0
    if args.load_state:
        state = read_state(args.load_state, settings, device)
        first_step = state["step"]
        g.set_state(state["data_generator"].cpu())
        torch.set_rng_state(state["torch_rng"].cpu())
        for name, run in runs.items():
            run.load(state["runs"][name])
        reference.load(state["reference"])
        print(f"N={C:<6} resumed from {args.load_state} at step {first_step}", flush=True)
    last_step = min(steps, args.stop_at) if args.stop_at else steps
    check = max(1, steps // 100)
    started = clock(device)
    for step in range(first_step, last_step):
        for run in runs.values():
            if step == 1:
                run.open_window("start", step, W)
            elif step == steps - W:
                run.open_window("end", step, W)
            if "middle" not in run.windows and step >= 1 + W:
                due = step % check == 0 and median_proxy_distance(run.loss_fn) <= args.middle_median
                if due or step == steps - 2 * W:
                    run.open_window("middle", step, W)
        if step and step % max(1, steps // 10) == 0:
            medians = ", ".join(
                f"{name} {median_proxy_distance(run.loss_fn):.2f}" for name, run in runs.items()
            )
            print(
                f"N={C:<6} step {step}/{steps}, {clock(device) - started:.0f} s; "
                f"median proxy distance {medians}",
                flush=True,
            )
            if args.save_state:
                save_state(args.save_state, settings, step, data, runs, reference)
        inputs, labels = data.batch()
        timed = {name: run.timed(step) for name, run in runs.items()}
        if any(timed.values()):
            reference.step(inputs, labels, step, timed=True)
        for name, run in runs.items():
            run.step(inputs, labels, step, timed[name])
            for stage in run.windows:
                if step == run.window_steps(stage)[-1]:  # printed as it closes: a long run reports as it goes
                    print(f"N={C:<6} {name:<12} {run.stage_cell(stage, reference)}", flush=True)
                    if args.step_times:
                        times = run.step_times(stage, reference)
                        print(f"N={C:<6} {name:<12} {stage} step:ms/ProxyAnchor ms {times}", flush=True)
    elapsed = clock(device) - started
    if args.save_state:
        save_state(args.save_state, settings, last_step, data, runs, reference)
    if last_step < steps:
        print(f"N={C:<6} stopped after step {last_step} ({elapsed:.0f} s); state in {args.save_state}")
        return
    for name, run in runs.items():
        cells = [run.stage_cell(stage, reference) for stage in ("start", "middle", "end")]
        print(f"N={C:<6} {name:<12} " + " | ".join(cells), flush=True)
    for name, run in runs.items():
        state, stats = run.neighbors.state, run.neighbors.stats
        skin = f"last skin {state.skin:.3f} (largest {state.max_skin:.3f})" if state else "no list"
        print(
            f"N={C:<6} {name:<12} {steps} steps; {skin}; "
            f"{stats.num_builds} builds ({stats.num_dense_builds} not kept), "
            f"{stats.num_dense_steps} dense steps, {stats.num_partial_rebuilds} partial re-anchors",
            flush=True,
        )
    print(f"N={C:<6} {elapsed:.0f} s for this scale; peak memory so far {peak_memory(device)}", flush=True)


def make_parser():
    """This script's options; their defaults are the trajectory's settings."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-classes", type=int, nargs="+", default=[400, 2000])
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps per scale (default: {DEFAULT_STEPS}, enough for the proxies to contract)",
    )
    parser.add_argument("--window", type=int, default=20, help="timed training steps per stage")
    parser.add_argument(
        "--middle-median",
        type=float,
        default=1.0,
        help="the middle window starts once the median pairwise proxy distance is at most this (1.41 at the start)",
    )
    parser.add_argument("--data", choices=sorted(DATA), default="hard")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--embedding-size", type=int, default=512)
    parser.add_argument("--input-size", type=int, default=256)
    parser.add_argument("--delta", type=float, default=0.4, help="the bench's PFML/CPML delta")
    parser.add_argument("--trunk-lr", type=float, default=5e-4)
    parser.add_argument("--proxy-lr-factor", type=float, default=100.0)
    parser.add_argument("--losses", nargs="+", default=["PFML", "CPML"], choices=list(LOSSES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bfloat16-search",
        choices=list(BFLOAT16_SEARCH),
        default="auto",
        help="the losses' searches multiply in bfloat16 where that pays on this CPU (auto, their default), "
        "always (yes) or never (no: float32 products, as on a CPU without bfloat16 instructions)",
    )
    parser.add_argument(
        "--step-times",
        action="store_true",
        help="also print every timed step of each window: the loss's time and ProxyAnchor's, in ms",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's; 1 on a shared, busy machine)",
    )
    parser.add_argument(
        "--save-state",
        metavar="PATH",
        help="write the trajectory's state here at every tenth of the run and when it stops (one scale)",
    )
    parser.add_argument(
        "--load-state", metavar="PATH", help="go on from a state written by --save-state (same settings)"
    )
    parser.add_argument(
        "--stop-at", type=int, metavar="STEP", help="stop after this many steps (with --save-state)"
    )
    add_device_options(parser)
    return parser


def main():
    parser = make_parser()
    args = parser.parse_args()
    device = check_device(parser, args)
    if (args.save_state or args.load_state) and len(args.num_classes) > 1:
        parser.error("--save-state and --load-state hold one scale: give one --num-classes")
    if args.stop_at is not None and (args.stop_at < 1 or not args.save_state):
        parser.error("--stop-at needs a positive step and --save-state (else the run is lost)")
    if args.window < 1 or (args.steps is not None and args.steps < 4):
        parser.error(
            "--window needs at least 1 step and --steps at least 4 (three windows after the first step)"
        )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # the losses search float32 points on a CPU with bfloat16 products where they pay, measured
    # once per process (bfloat16_search=None, their default), or as --bfloat16-search says: the
    # ratios depend on it
    pays = "yes" if device.type == "cpu" and bfloat16_products_pay() else "no"
    searches = {"auto": "bfloat16 where they pay", "yes": "bfloat16", "no": "float32"}[args.bfloat16_search]
    if device.type != "cpu":
        searches = "float32 (bfloat16 searches are for CPUs)"
    print(
        f"B={args.batch_size} D={args.embedding_size} M=2 delta={args.delta} data={args.data} "
        f"window={args.window} {describe(args)} bfloat16 products pay: {pays}; searches: {searches}",
        flush=True,
    )
    for C in args.num_classes:
        try:
            run_scale(args, C, torch.Generator().manual_seed(args.seed))
        except StateFileError as error:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        except FileFault as error:
            parser.exit(1, f"{parser.prog}: error: {error}\n")


if __name__ == "__main__":
    main()

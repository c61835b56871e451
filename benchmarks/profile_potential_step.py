"""Where a potential loss's training step spends what a GPU charges for: its operations and
the places where the host waits for the device, next to ProxyAnchorLoss's, part way along
``bench_potential_training.py``'s trajectory.

    python benchmarks/profile_potential_step.py                         # N = 400, after 300 steps
    python benchmarks/profile_potential_step.py --device cuda --loss CPML --after 75

The loss trains ``--after`` steps of ``bench_potential_training.py``'s hard data (its trunk,
optimisers and learning rates), then ``--steps`` more steps are timed (the loss's forward and
backward, each after ProxyAnchorLoss's on the same batch, as that script times them), counted
(benchmarks/ops.py: operations dispatched, host waits) and the waits traced to the lines of
this package that asked for them. On CUDA the kernel launches are counted too
(``torch.profiler``); where Python has the ``resource`` module (Unix), the process's minor
page faults during the timed steps (memory the C allocator took from the system anew, which
a CPU pays for at each first touch). The counts are those of the device the step runs on;
``--as-gpu`` gives the loss the settings it takes on a GPU (benchmarks/ops.py,
``as_on_gpu``) for the whole run, so that a CPU counts what a GPU would run (its times are
then not a CPU's).
"""

import argparse
import collections
import contextlib
import copy
import statistics
import traceback

try:
    import resource  # page faults (Unix)
except ImportError:
    resource = None

import torch
from bench_potential_training import LOSSES, Data, Run, make_loss, make_parser
from device import add_device_options, check_device, describe
from ops import OpCounter, as_on_gpu, waits
from pytorch_metric_learning import losses as pml_losses


PACKAGE = "pml_fieldlosses/"


class WaitSites(OpCounter):
    """OpCounter that also counts, per line of this package (the innermost two frames), the
    operations after which the host waits."""

    def __init__(self):
        super().__init__()
        self.sites = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if waits(func.overloadpacket.__name__, args, kwargs):
            frames = [f for f in traceback.extract_stack() if PACKAGE in f.filename][-2:]
            where = " <- ".join(
                f"{f.filename.split(PACKAGE)[-1]}:{f.lineno} {f.name}" for f in reversed(frames)
            )
            self.sites[where or "outside the package (optimiser, autograd)"] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def page_faults():
    """The process's minor page faults so far (0 where the resource module is missing)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def kernel_launches(run, batches, first_step):
    """Kernel launches per step on CUDA (torch.profiler's cudaLaunchKernel events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for offset, (inputs, labels) in enumerate(batches):
            run.step(inputs, labels, first_step + offset, timed=False)
    launches = sum(e.count for e in prof.key_averages() if e.key in ("cudaLaunchKernel", "cuLaunchKernel"))
    return launches / len(batches)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-classes", type=int, default=400)
    parser.add_argument("--loss", choices=list(LOSSES), default="PFML")
    parser.add_argument("--after", type=int, default=300, help="training steps before the profiled ones")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps")
    parser.add_argument("--sites", type=int, default=15, help="wait sites printed")
    parser.add_argument("--as-gpu", action="store_true", help="the loss's GPU settings, on any device")
    add_device_options(parser)
    args = parser.parse_args()
    device = check_device(parser, args)
    if args.num_classes < 1 or args.after < 0 or args.steps < 1:
        parser.error("--num-classes and --steps must be positive, --after at least 0")
    # the trajectory: bench_potential_training.py's default settings (its options' defaults)
    trajectory = make_parser().parse_args([])
    args.trunk_lr, args.proxy_lr_factor = trajectory.trunk_lr, trajectory.proxy_lr_factor
    torch.manual_seed(trajectory.seed)
    C, D, D_in = args.num_classes, trajectory.embedding_size, trajectory.input_size
    generator = torch.Generator().manual_seed(trajectory.seed)
    data = Data(C, D_in, trajectory.batch_size, trajectory.data, generator, device)
    trunk = torch.nn.Linear(D_in, D)
    run = Run(make_loss(args.loss, C, D, trajectory.delta).to(device), copy.deepcopy(trunk).to(device), args)
    reference = Run(pml_losses.ProxyAnchorLoss(C, D).to(device), copy.deepcopy(trunk).to(device), args)
    with as_on_gpu(run.loss_fn) if args.as_gpu else contextlib.nullcontext():
        profile(args, device, data, run, reference)


def profile(args, device, data, run, reference):
    C = args.num_classes
    for step in range(args.after):
        run.step(*data.batch(), step, timed=False)
    batches = [data.batch() for _ in range(args.steps)]
    step = args.after
    faults = {"loss": 0, "reference": 0}
    for inputs, labels in batches:
        for name, r in [("reference", reference), ("loss", run)]:
            before = page_faults()
            r.step(inputs, labels, step, timed=True)
            faults[name] += page_faults() - before
        step += 1
    timed = range(args.after, step)
    ms = {
        name: 1e3 * statistics.mean(r.records[s]["seconds"] for s in timed)
        for name, r in [("loss", run), ("reference", reference)]
    }
    counts = {}
    for name, r in [("loss", run), ("reference", reference)]:
        with WaitSites() as counter:
            for inputs, labels in batches:
                r.step(inputs, labels, step, timed=False)
                step += 1
        counts[name] = counter
    settings = ", with its GPU settings" if args.as_gpu else ""
    print(
        f"{describe(args)} N={C} {args.loss}{settings} after {args.after} steps, {args.steps} steps profiled"
    )
    print(f"{'':<22}{args.loss:>10}{'ProxyAnchor':>13}{'ratio':>8}")
    rows = [("loss fwd+bwd ms", ms["loss"], ms["reference"])]
    for label, attribute in [("operations / step", "ops"), ("host waits / step", "waits")]:
        rows.append(
            (
                label,
                getattr(counts["loss"], attribute) / args.steps,
                getattr(counts["reference"], attribute) / args.steps,
            )
        )
    if resource is not None:
        rows.append(("page faults / step", faults["loss"] / args.steps, faults["reference"] / args.steps))
    if device.type == "cuda":
        rows.append(
            (
                "kernel launches / step",
                kernel_launches(run, batches, step),
                kernel_launches(reference, batches, step),
            )
        )
    for label, value, baseline in rows:
        print(
            f"{label:<22}{value:>10.1f}{baseline:>13.1f}{value / baseline if baseline else float('nan'):>8.2f}"
        )
    print("(the counts cover the whole training step: trunk, loss, backward and optimisers;")
    print(" page faults: the process's minor faults, memory the C allocator took from the system anew)")
    print(f"host waits of {args.loss} per step, by place:")
    for where, count in counts["loss"].sites.most_common(args.sites):
        print(f"{count / args.steps:8.2f}  {where}")


if __name__ == "__main__":
    main()

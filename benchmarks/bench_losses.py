"""Forward+backward time and peak memory of our losses next to PML's.

    python benchmarks/bench_losses.py                 # full grid, CPU
    python benchmarks/bench_losses.py --quick         # one small shape
    python benchmarks/bench_losses.py --device cuda --autocast float16 --losses MFCont MFCWMS

Times are medians over --reps interleaved rounds in one process, printed with
their ratio to ProxyAnchorLoss at the same shape. With --autocast the forward
pass runs under torch.autocast of that dtype and the backward pass outside it,
as in a mixed-precision training step (benchmarks/device.py); on CUDA the clock
is read after torch.cuda.synchronize. Peak memory is measured for
each (loss, shape) in a fresh subprocess: on CPU (Linux) the peak resident set
size during one forward+backward (VmHWM, reset through /proc/self/clear_refs
just before) minus the resident size before it, i.e. on top of the inputs and
the loss's parameters; on CUDA torch.cuda.max_memory_allocated likewise.

``--ops`` adds what one step asks of a GPU, counted on any device (benchmarks/ops.py): the
aten operations dispatched (about one kernel launch each on a GPU, where a step at these
shapes is bound by them) with their ratio to ProxyAnchorLoss's, and the operations after
which the host waits for the device (data-dependent shapes, values read on the host).
``--ops-as-gpu`` counts them on any device with the settings the potential losses take on a
GPU (``ops.as_on_gpu``: float32 searches, larger blocks, no tile screening): what a GPU's
step would launch, counted without one.
"""

import argparse
import contextlib
import json
import math
import re
import statistics
import subprocess
import sys

import torch
from device import add_device_options, autocast, check_device, clock, describe, synchronize
from ops import OpCounter, as_on_gpu

from pml_fieldlosses.app import catalog

# name -> builder(num_classes, embedding_size): the losses of the one loss table
# (pml_fieldlosses.app.catalog) at their published defaults, and a few variants
LOSSES = {
    **{name: catalog.published(name) for name in ("ProxyAnchor", "MultiSimilarity", "MFCont", "CWMS")},
    "MFCont+reg": catalog.published("MFCont", mf_reg_weight=1.0),
    "MFCWMS": catalog.published("MFCWMS"),
    "MFCWMS+reg": catalog.published("MFCWMS", mf_reg_weight=1.0),
    "PFML": catalog.published("PFML"),
    "CPML": catalog.published("CPML"),
    "PFML-M15": catalog.published("PFML", proxies_per_class=15),
}
DEFAULT_LOSSES = ["ProxyAnchor", "MultiSimilarity", "MFCont", "CWMS", "MFCWMS", "PFML", "CPML"]
BATCH_SIZES = [64, 180, 256, 1024]
NUM_CLASSES = [100, 1000, 11318]
EMBEDDING_SIZE = 512


def make_inputs(batch_size, num_classes, embedding_size, device, seed=0):
    """Embeddings and labels with (at least) 4 samples per class, as an MPerClassSampler gives."""
    g = torch.Generator().manual_seed(seed)
    per_class = max(4, math.ceil(batch_size / num_classes))
    classes = torch.randperm(num_classes, generator=g)[: math.ceil(batch_size / per_class)]
    labels = classes.repeat_interleave(per_class)[:batch_size]
    embeddings = torch.randn(batch_size, embedding_size, generator=g)
    return embeddings.to(device).requires_grad_(), labels.to(device)


def forward_backward(loss_fn, embeddings, labels, args):
    """One training step of the loss: forward under the --autocast context, backward outside."""
    loss_fn.zero_grad(set_to_none=True)
    embeddings.grad = None
    with autocast(args):
        loss = loss_fn(embeddings, labels)
    loss.backward()


def time_losses(names, batch_size, num_classes, args, reps):
    embeddings, labels = make_inputs(batch_size, num_classes, EMBEDDING_SIZE, args.device)
    loss_fns = {name: LOSSES[name](num_classes, EMBEDDING_SIZE).to(args.device) for name in names}
    for loss_fn in loss_fns.values():  # warm-up
        forward_backward(loss_fn, embeddings, labels, args)
    times = {name: [] for name in names}
    for _ in range(reps):
        for name, loss_fn in loss_fns.items():
            start = clock(args.device)
            forward_backward(loss_fn, embeddings, labels, args)
            times[name].append(clock(args.device) - start)
    return {name: statistics.median(t) for name, t in times.items()}


def count_ops(names, batch_size, num_classes, args):
    """(operations, host waits) of one step of each loss, after a warm-up step (counted apart
    from the timed steps: the counting costs time)."""
    embeddings, labels = make_inputs(batch_size, num_classes, EMBEDDING_SIZE, args.device)
    counts = {}
    for name in names:
        loss_fn = LOSSES[name](num_classes, EMBEDDING_SIZE).to(args.device)
        with as_on_gpu(loss_fn) if args.ops_as_gpu else contextlib.nullcontext():
            forward_backward(loss_fn, embeddings, labels, args)
            with OpCounter() as counter:
                forward_backward(loss_fn, embeddings, labels, args)
        counts[name] = (counter.ops, counter.waits)
    return counts


def proc_status_bytes(key):
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+) kB", f.read()).group(1)) * 1024


def peak_memory_child(name, batch_size, num_classes, args):
    """Runs in a fresh process; prints the peak extra memory in bytes."""
    device = torch.device(args.device)
    embeddings, labels = make_inputs(batch_size, num_classes, EMBEDDING_SIZE, device)
    loss_fn = LOSSES[name](num_classes, EMBEDDING_SIZE).to(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        forward_backward(loss_fn, embeddings, labels, args)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        before = proc_status_bytes("VmRSS")
        forward_backward(loss_fn, embeddings, labels, args)
        peak = proc_status_bytes("VmHWM") - before
    print(json.dumps({"peak_bytes": peak}))


def peak_memory(name, batch_size, num_classes, args):
    cmd = [sys.executable, __file__, "--child", name, str(batch_size), str(num_classes)]
    cmd += ["--device", args.device, "--autocast", args.autocast]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_bytes"]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--losses", nargs="+", default=DEFAULT_LOSSES, choices=list(LOSSES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=BATCH_SIZES)
    parser.add_argument("--num-classes", nargs="+", type=int, default=NUM_CLASSES)
    add_device_options(parser)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--ops",
        action="store_true",
        help="also count each step's operations and host waits (benchmarks/ops.py)",
    )
    parser.add_argument(
        "--ops-as-gpu",
        action="store_true",
        help="--ops with the potential losses' GPU settings, on any device",
    )
    parser.add_argument("--quick", action="store_true", help="B=64, C=100, 2 reps")
    parser.add_argument("--child", nargs=3, metavar=("LOSS", "B", "C"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.ops = args.ops or args.ops_as_gpu
    check_device(parser, args)
    if args.child:
        name, batch_size, num_classes = args.child
        return peak_memory_child(name, int(batch_size), int(num_classes), args)
    if args.quick:
        args.batch_sizes, args.num_classes, args.reps = [64], [100], 2
    names = list(dict.fromkeys(["ProxyAnchor"] + args.losses))

    print(f"{describe(args)} D={EMBEDDING_SIZE}")
    header = f"{'B':>5} {'C':>6} {'loss':<16} {'fwd+bwd ms':>10} {'xProxyAnchor':>12} {'us/sample':>9} {'peak MB':>8}"
    print(header + (f" {'ops':>6} {'xProxyAnchor':>12} {'waits':>5}" if args.ops else ""))
    for num_classes in args.num_classes:
        for batch_size in args.batch_sizes:
            times = time_losses(names, batch_size, num_classes, args, args.reps)
            counts = count_ops(names, batch_size, num_classes, args) if args.ops else None
            for name in names:
                memory = (
                    ""
                    if args.no_memory
                    else f"{peak_memory(name, batch_size, num_classes, args) / 2**20:8.1f}"
                )
                line = (
                    f"{batch_size:>5} {num_classes:>6} {name:<16} {times[name] * 1e3:>10.2f} "
                    f"{times[name] / times['ProxyAnchor']:>12.2f} {times[name] / batch_size * 1e6:>9.1f} {memory:>8}"
                )
                if counts:
                    (ops, waits), (reference_ops, _) = counts[name], counts["ProxyAnchor"]
                    line += f" {ops:>6} {ops / reference_ops:>12.2f} {waits:>5}"
                print(line, flush=True)


if __name__ == "__main__":
    main()

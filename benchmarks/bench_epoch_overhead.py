"""What one epoch of a bench run costs outside its loss: reading the batches and the records.

    python benchmarks/bench_epoch_overhead.py                 # the default bench's epoch, CPU
    python benchmarks/bench_epoch_overhead.py --device cuda --autocast float16

One epoch of `pml-fieldlosses bench` on its default data: 4 301 training samples of 3 888
cached features in 5 views (memory-mapped), 753 classes, batches of 128 (33 per epoch,
MPerClassSampler, m = 4), a Linear(3888, 128) embedder and ProxyAnchorLoss(753, 128). Three
parts are timed, each the old way and the bench's way, interleaved over --reps rounds in one
process (medians):

* read: the epoch's batches from the memory-mapped views, item by item with torch's default
  collation (the old way) or a whole batch at once (ViewsDataset.__getitems__ and
  features.collate), then moved to --device;
* records: PML's hooks recording every 10 iterations and saving after the epoch, with PML's
  record keeper (the old way) or the bench's (bench/records.py: the same files, no list made
  of the proxies, SQLite committed without waiting for the disk);
* clip: the gradient clipping of the embedder's and the loss's parameters at every step (max
  norm 10, as the bench), with torch's ``clip_grad_norm_`` (the old way) or the bench's
  ``GradClipper`` (bench/run.py: the same gradients, torch's scaling by exactly 1 left out),
  timed on the gradients of each step;
* steps: the 33 training steps themselves (embedder and loss forward under --autocast,
  backward, AdamW), the same both ways: the scale the overheads are read against.

The batches, gradients and files are the same both ways (tests/test_bench_speed.py checks
it). The records' time depends on the disk (an fsync per SQLite commit): run it where the
bench runs.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import device as bench_device  # this folder's device options (on sys.path as a script)
import numpy as np
import torch
from pytorch_metric_learning import losses, samplers
from pytorch_metric_learning.utils import logging_presets

from pml_fieldlosses.app.bench import features, records
from pml_fieldlosses.app.bench.protocol import BenchConfig
from pml_fieldlosses.app.bench.run import GradClipper

CLIP = BenchConfig.grad_clip  # the bench's max gradient norm


class PlainViews(features.ViewsDataset):
    __getitems__ = None  # item by item: torch's DataLoader without a batch read


def read_epoch(dataset, labels, collate, device, batch_size):
    sampler = samplers.MPerClassSampler(labels, 4, batch_size, length_before_new_iter=len(labels))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, collate_fn=collate
    )
    batches = [[part.to(device) for part in batch] for batch in loader]
    bench_device.synchronize(device)
    return batches


def record_epoch(get_record_keeper, folder, loss, optimizer, iterations):
    """What PML's HookContainer records in one epoch: every 10 iterations, then saved."""
    keeper, _, writer = get_record_keeper(str(folder / "records"), str(folder / "tensorboard"))
    hooks = logging_presets.get_hook_container(keeper, log_freq=10)
    trainer = SimpleNamespace(
        loss_tracker=SimpleNamespace(
            losses={"metric_loss": 1.0, "total_loss": 1.0}, loss_weights={"metric_loss": 1}
        ),
        loss_funcs={"metric_loss": loss},
        mining_funcs={},
        models={},
        optimizers={"metric_loss_optimizer": optimizer},
    )
    for iteration in range(iterations):
        trainer.iteration = iteration
        trainer.get_global_iteration = lambda: trainer.iteration
        hooks.end_of_iteration_hook(trainer)
    keeper.save_records()
    writer.close()


def train_epoch(args, device, batches, embedder, loss, optimizer, times):
    """The epoch's steps, timed without their clipping ("steps"), and the old and the new
    clipping, each timed on a copy of every step's gradients ("clip old", "clip new")."""
    parameters = [*embedder.parameters(), *loss.parameters()]
    clippers = {
        "clip old": lambda: torch.nn.utils.clip_grad_norm_(parameters, CLIP),
        "clip new": GradClipper(parameters, CLIP),
    }
    totals = dict.fromkeys(("steps", *clippers), 0.0)
    for inputs, labels in batches:
        start = bench_device.clock(device)
        optimizer.zero_grad()
        with bench_device.autocast(args):
            value = loss(embedder(inputs), labels)
        value.float().backward()
        bench_device.synchronize(device)
        totals["steps"] += bench_device.clock(device) - start
        grads = [p.grad.clone() for p in parameters]
        for key, clip in clippers.items():
            for p, grad in zip(parameters, grads):
                p.grad.copy_(grad)
            bench_device.synchronize(device)
            start = bench_device.clock(device)
            clip()
            bench_device.synchronize(device)
            totals[key] += bench_device.clock(device) - start
        start = bench_device.clock(device)
        optimizer.step()
        bench_device.synchronize(device)
        totals["steps"] += bench_device.clock(device) - start
    for key, total in totals.items():
        times[key].append(total)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=4301, help="training samples (default: %(default)s)")
    parser.add_argument("--features", type=int, default=3888, help="feature width (default: %(default)s)")
    parser.add_argument("--classes", type=int, default=753, help="training classes (default: %(default)s)")
    parser.add_argument("--views", type=int, default=5, help="views per sample (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--embedding-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved rounds (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads, as a bench run has (default: 1)"
    )
    bench_device.add_device_options(parser)
    args = parser.parse_args()
    device = bench_device.check_device(parser, args)
    torch.set_num_threads(args.threads)
    print(bench_device.describe(args))
    with tempfile.TemporaryDirectory(prefix="bench_epoch_overhead_") as folder:
        measure(args, device, Path(folder))


def measure(args, device, folder):
    rng = np.random.default_rng(0)
    path = folder / "view.npy"
    np.save(path, rng.standard_normal((args.samples, args.features), dtype=np.float32))
    mapped = np.load(path, mmap_mode="r")
    rows = [rng.permutation(args.samples) for _ in range(args.views)]
    labels = np.arange(args.samples) % args.classes
    old_data, new_data = (
        PlainViews([mapped] * args.views, rows, labels),
        features.ViewsDataset([mapped] * args.views, rows, labels),
    )
    torch.manual_seed(0)
    embedder = torch.nn.Linear(args.features, args.embedding_size).to(device)
    loss = losses.ProxyAnchorLoss(args.classes, args.embedding_size).to(device)
    optimizer = torch.optim.AdamW([*embedder.parameters(), *loss.parameters()], 1e-2)
    keys = ("read old", "read new", "records old", "records new", "clip old", "clip new", "steps")
    times = {key: [] for key in keys}
    for dataset, collate in ((old_data, None), (new_data, features.collate)):  # warm up, untimed
        read_epoch(dataset, labels, collate, device, args.batch_size)
    for rep in range(args.reps):
        for key, run in (
            ("read old", lambda: read_epoch(old_data, labels, None, device, args.batch_size)),
            ("read new", lambda: read_epoch(new_data, labels, features.collate, device, args.batch_size)),
        ):
            start = bench_device.clock(device)
            batches = run()
            times[key].append(bench_device.clock(device) - start)
        iterations = len(batches)
        for key, keeper in (
            ("records old", logging_presets.get_record_keeper),
            ("records new", records.get_record_keeper),
        ):
            start = time.perf_counter()
            record_epoch(keeper, folder / f"{key.split()[1]}{rep}", loss, optimizer, iterations)
            times[key].append(time.perf_counter() - start)
        train_epoch(args, device, batches, embedder, loss, optimizer, times)
    ms = {key: 1e3 * statistics.median(values) for key, values in times.items()}
    print(
        f"one epoch: {iterations} batches of {args.batch_size}, {args.samples} samples x {args.features} "
        f"features in {args.views} views, {args.classes} classes; medians of {args.reps} rounds"
    )
    print(
        f"read batches   old {ms['read old']:8.1f} ms  new {ms['read new']:8.1f} ms  "
        f"x{ms['read old'] / ms['read new']:.2f}"
    )
    print(
        f"records        old {ms['records old']:8.1f} ms  new {ms['records new']:8.1f} ms  "
        f"x{ms['records old'] / ms['records new']:.2f}"
    )
    print(
        f"clip           old {ms['clip old']:8.1f} ms  new {ms['clip new']:8.1f} ms  "
        f"x{ms['clip old'] / ms['clip new']:.2f}"
    )
    old = ms["read old"] + ms["records old"] + ms["clip old"]
    new = ms["read new"] + ms["records new"] + ms["clip new"]
    print(f"training steps     {ms['steps']:8.1f} ms")
    print(
        f"epoch (read + records + clip + steps)  old {old + ms['steps']:8.1f} ms  "
        f"new {new + ms['steps']:8.1f} ms  "
        f"x{(old + ms['steps']) / (new + ms['steps']):.2f}"
    )


if __name__ == "__main__":
    main()

"""The one pipeline of ``bench``, ``select`` and ``claims``: a plan of runs -> their results.

A plan is a list of parts, one per results folder: a BenchConfig (the data, the label noise
and the rest of the protocol) and the (loss, seed) jobs to run with it. Each part is
prepared (the data loaded, the folder's protocol.json checked, the split made, the inputs
computed, every loss built once), then its runs go to the backend (the local process pool,
or Ray) through runs.run_all, which reads back the runs a killed invocation finished. The
wall time of an invocation is summed over the invocations on a folder (its wall_time.json),
however the invocation ends. A results folder is one command's at a time (hold_folders).

start = time.perf_counter()
part = Part(config)  # every loss and seed of config, with the untrained row
with hold_folders([part.folder], sys.stderr):
    prepared = prepare_part(part, sys.stderr)
    with wall_time(part.folder, start, sys.stderr) as clock:
        results = prepared.run(sys.stderr)

benchmark.py (bench), selection.py (select) and app.claims drive it; it knows none of them.
"""

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..catalog import get_entry
from ..datasets import load_dataset
from ..errors import FileFault, file_fault
from . import scheduler
from .features import prepare_inputs
from .lock import hold_folders
from .protocol import make_split
from .result import BenchFileError, add_wall_time, earlier_wall_times, read_json, write_json
from .runs import run_all

__all__ = ["Part", "hold_folders", "prepare_part", "report_log", "run_plan", "wall_time"]


@dataclass(frozen=True)
class Part:
    """The runs of one results folder. ``config`` fixes the data, the label noise and
    the protocol; ``jobs`` are the (loss, seed) runs in order (None: every loss and seed
    of ``config`` after the untrained row, runs.all_jobs). ``selection``:
    the hyperparameter selection's folder and protocol, and no test evaluation."""

    config: object  # protocol.BenchConfig
    jobs: Optional[list] = None
    selection: bool = False

    @property
    def folder(self):
        return Path(self.config.out) / self.config.folder_name(selection=self.selection)


@dataclass
class Prepared:
    """A part ready to run: its data set, split, the runs' inputs, and the seconds spent loading the data."""

    part: Part
    dataset: object  # datasets.ImageSet
    split: object  # protocol.Split
    inputs: object  # features.Inputs
    data_seconds: float

    def run(self, file):
        """The part's RunResults in job order (runs.run_all: a finished run is read back, not redone)."""
        config = self.part.config
        return run_all(
            self.inputs,
            config,
            self.part.folder,
            file=file,
            jobs=self.part.jobs,
            test=not self.part.selection,
            backend=backend(config),
        )


def prepare_part(part, file):
    """The part's folder checked (or started) and its inputs ready (see ``prepare``)."""
    return Prepared(part, *prepare(part.config, part.folder, file, selection=part.selection))


def run_plan(parts, file):
    """Prepare and run each part in turn (one part's data in memory at a time). Returns
    [(part, the name of its data set, its RunResults in job order)]."""
    done = []
    for part in parts:
        prepared = prepare_part(part, file)
        done.append((part, prepared.dataset.name, prepared.run(file)))
    return done


def load_data(config):
    return load_dataset(config.data, config.image_size, config.cache)


def check_config(config, in_features, num_classes):
    """Build every requested loss once, so that a bad combination fails now and
    not after an hour of other runs."""
    for name in config.losses:
        entry = get_entry(name)
        try:
            entry.make_embedder(in_features, config.embedding_size)
            entry.build(num_classes, config.embedding_size)
        except (ValueError, TypeError) as e:
            raise ValueError(f"loss {name} cannot be built with these settings: {e}") from e


def backend(config):
    """Where the runs go: the local process pool, or Ray with ``config.ray_address``."""
    if config.ray_address is None:
        return scheduler.run_jobs
    from .ray_backend import ray_backend  # ray only when asked for

    address = None if config.ray_address == "local" else config.ray_address
    return ray_backend(address, torch.device(config.device).type)


def prepare(config, out_dir, file, selection=False):
    """Load the data, check (or write) the folder's protocol.json, split, prepare
    the runs' inputs and check that every loss builds. Returns (dataset,
    split, inputs, seconds spent loading the data)."""
    t = time.perf_counter()
    dataset = load_data(config)
    data_seconds = time.perf_counter() - t
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise file_fault(e, out_dir, "creating the results folder") from e
    check_or_write_protocol(out_dir, config.protocol(selected=not selection), dataset.fingerprint())
    split = make_split(dataset, config.val_fraction)
    print(
        f"data: {dataset.name}, {len(dataset.images)} images of {dataset.num_classes} classes at "
        f"{dataset.image_size} px ({data_seconds:.0f} s); classes train/val/test "
        f"{split.num_train_classes}/{len(np.unique(split.val_labels))}/{len(np.unique(split.test_labels))}",
        file=file,
    )
    inputs = prepare_inputs(dataset, split, config, file=file)
    if inputs.seconds:
        print(f"frozen features computed and cached in {inputs.seconds:.0f} s", file=file)
    check_config(config, inputs.in_features, split.num_train_classes)
    return dataset, split, inputs, data_seconds


def check_or_write_protocol(out_dir, protocol, data_fingerprint):
    """Finished runs are reused only for the same settings and the same data."""
    path = out_dir / "protocol.json"
    protocol = {**protocol, "data_fingerprint": data_fingerprint}
    if path.exists():
        try:
            saved = read_json(path)
        except BenchFileError as e:
            raise BenchFileError(
                f"{e}; use another --out, or delete the folder (rm -r '{out_dir}')"
            ) from None
        if saved != json.loads(json.dumps(protocol)):
            raise FileFault(
                f"{out_dir} holds results of other settings or other data; use another --out or delete it"
            )
        return
    write_json(path, protocol)


@dataclass
class Clock:
    """This invocation's start and the wall seconds of the earlier invocations on a folder."""

    start: float
    earlier: list

    def seconds(self):
        """Every invocation's seconds up to now (for a report written before this invocation ends)."""
        return sum(self.earlier) + time.perf_counter() - self.start

    @property
    def invocations(self):
        return len(self.earlier) + 1


@contextlib.contextmanager
def wall_time(folder, start, file=None):
    """Sum this invocation (from ``start``, a time.perf_counter) with the earlier ones in
    ``folder``'s wall_time.json, however the block ends: an interrupted or failed
    invocation's time counts too (if the file cannot be written then, a warning says so
    and the first error goes on). The earlier ones are read first, so that a bad file
    fails now, not after the runs. Yields a Clock; prints the sums when the block succeeds."""
    clock = Clock(start, earlier_wall_times(folder))
    try:
        yield clock
    except BaseException:
        try:
            add_wall_time(folder, time.perf_counter() - start)
        except FileFault as e:
            print(f"warning: this invocation's wall time is not counted: {e}", file=file or sys.stderr)
        raise
    seconds = time.perf_counter() - start
    total, invocations = add_wall_time(folder, seconds)
    print(
        f"wall time: {seconds:.0f} s ({invocations} invocation(s) on this folder: {total:.0f} s)",
        file=sys.stdout,
    )


@contextlib.contextmanager
def report_log(folder):
    """Send what the libraries print while the report is drawn to ``folder``/report_log.txt."""
    path = folder / "report_log.txt"
    try:
        log = open(path, "w")
    except OSError as e:
        raise file_fault(e, path, "writing the report's log") from e
    try:
        with log, contextlib.redirect_stderr(log):
            yield
    except OSError as e:  # the log's own writes, or a library's file (a figure's are FileFaults)
        raise file_fault(e, e.filename or path, "writing the report") from e

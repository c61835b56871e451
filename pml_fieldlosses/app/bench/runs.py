"""All the runs of a benchmark: which to do, which finished (a killed benchmark
resumes), each run into its folder, spread over the scheduler's workers, with
progress and an estimate of the time left on the terminal.

A run is finished when its folder holds a valid result.json (written last, atomically)
of the same loss setting and seed, and, for a tested seed-0 run, valid test embeddings;
anything else (a killed run, a half-written or damaged file) is named in a warning and
the run trained again. A run's folder is named by its loss's canonical name
(result.run_name), so two settings never share one. A file-system fault in a run (a full
disk, a read-only folder) stops the command with a FileFault naming the path."""

import dataclasses
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tqdm

from ..errors import FileFault, file_fault
from . import scheduler
from .baseline import evaluate_untrained
from .protocol import number_of_workers
from .result import (
    UNTRAINED,
    BenchFileError,
    RunResult,
    canonical_name,
    file_system_fault,
    legacy_run_folder,
    read_embeddings,
    run_folder,
    run_name,
)
from .run import run_log, train_one

__all__ = ["UNTRAINED", "RunResult", "run_all", "run_folder", "run_name", "train_one"]


@dataclass(frozen=True)
class Shared:
    """What every run of one benchmark reads: its inputs, settings and folder."""

    inputs: object
    config: object
    out_dir: Path
    test: bool = True


def execute_run(shared, job, report=None):
    """Run one (loss, seed) job into its fresh folder and write its result.json
    last (so a folder without one is an unfinished run). Training is
    single-threaded: every run is timed under the same conditions, tiny ops do
    not suffer from thread contention, and the cores are used by running jobs
    side by side."""
    name, seed = job
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    run_dir = run_folder(shared.out_dir, name, seed)
    try:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        with run_log(run_dir / "log.txt"):
            if name == UNTRAINED:
                result = evaluate_untrained(seed, shared.inputs, shared.config)
            else:
                tensorboard_dir = Path(shared.out_dir) / "tensorboard" / run_name(name) / f"seed{seed}"
                shutil.rmtree(tensorboard_dir, ignore_errors=True)
                result = train_one(
                    name, seed, shared.inputs, shared.config, run_dir, tensorboard_dir, report, shared.test
                )
        result.write(run_dir / "result.json")
        return result
    except OSError as e:  # the run's own files: records, logs, models, embeddings
        raise file_fault(e, e.filename or run_dir, f"training {name} seed {seed}: writing") from e
    except FileFault:
        raise
    except Exception as e:
        # a library's write failing in its own words (torch.save, sqlite): named by the folder
        code = file_system_fault(run_dir)
        if code is None:
            raise
        fault = OSError(code, os.strerror(code))
        raise file_fault(fault, run_dir, f"training {name} seed {seed}: writing in") from e
    finally:
        torch.set_num_threads(threads)


def seed_major(config):
    """Every (loss, seed) of ``config``, seed-major (all losses with seed 0 first)."""
    return [(name, seed) for seed in range(config.seeds) for name in config.losses]


def all_jobs(config, frozen_untrained):
    """Every (loss, seed), seed-major, after the untrained row: once when its model
    does not depend on the seed, else once per seed."""
    untrained_seeds = [0] if frozen_untrained else range(config.seeds)
    return [(UNTRAINED, seed) for seed in untrained_seeds] + seed_major(config)


def finished(out_dir, jobs, file, test_labels=None):
    """{job: RunResult} of the jobs whose run finished (see the module's docstring); a bad
    one is named and its run redone. ``test_labels``: the test split's labels, which a
    tested run's embeddings must have."""
    done = {}
    for job in jobs:
        name, seed = job
        folder = run_folder(out_dir, name, seed)
        if not (folder / "result.json").exists():
            move_legacy_run(out_dir, name, seed, file)
        result, problem = read_run(folder, name, seed, test_labels)
        if problem:
            print(f"warning: {problem}; running {name} seed {seed} again", file=file)
        elif result is not None:
            # the same setting may be written another way (PFML[delta=.5] for PFML[delta=0.5])
            done[tuple(job)] = dataclasses.replace(result, loss=name)
    return done


def read_run(folder, name, seed, test_labels=None):
    """(the RunResult of (``name``, ``seed``) finished in ``folder``, None) or (None, what
    is wrong with it); (None, None) when there is no result.json."""
    path = folder / "result.json"
    if not path.exists():
        return None, None
    try:
        result = RunResult.read(path)
    except BenchFileError as e:
        return None, str(e)
    if (canonical_name(result.loss), result.seed) != (canonical_name(name), seed):
        return None, f"{path} holds {result.loss} seed {result.seed}"
    if result.test is not None and result.seed == 0 and result.loss != UNTRAINED and test_labels is not None:
        embeddings = folder / "test_embeddings.npz"
        try:
            if read_embeddings(embeddings, len(test_labels), test_labels, finite=False) is None:
                return None, f"{embeddings} is missing"
        except BenchFileError as e:
            return None, str(e)
    return result, None


def move_legacy_run(out_dir, name, seed, file):
    """Move a finished run of (``name``, ``seed``) from the folder earlier versions named it
    by (result.legacy_run_folder) to its folder now, if it is there and of the same setting."""
    legacy, folder = legacy_run_folder(out_dir, name, seed), run_folder(out_dir, name, seed)
    if legacy == folder or read_run(legacy, name, seed)[0] is None:
        return
    try:
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.replace(legacy, folder)
    except OSError as e:
        raise file_fault(e, legacy, f"moving the finished run {name} seed {seed} to {folder} from") from e
    print(f"{name} seed {seed}: moved from {legacy} to {folder}", file=file)


class Progress:
    """One terminal line: runs done, the running runs' epoch and validation
    MAP@R, and the time left, estimated from the epochs seen so far per loss
    (every run taken to its maximum epochs: early stopping only shortens it)."""

    def __init__(self, todo, config, workers, file):
        self.config, self.workers = config, workers
        self.left = {job: config.epochs if job[0] != UNTRAINED else 0 for job in todo}
        self.epoch_seconds, self.started = {}, time.perf_counter()
        self.bar = tqdm.tqdm(total=len(todo), desc=f"runs ({workers} in parallel)", unit="run", file=file)
        self.bar.set_postfix_str("time left: estimated after the first epochs")

    def __call__(self, kind, job, value):
        name, seed = job
        if kind == "progress":
            self.epoch_seconds.setdefault(name, []).append(value["seconds"])
            self.left[job] = max(0, self.config.epochs - value["epoch"])
            status = f"{name} seed {seed}: epoch {value['epoch']}/{self.config.epochs}, "
            status += f"val MAP@R {value['val']:.3f}"
        else:
            self.left.pop(job, None)
            self.bar.update(1)
            status = f"{name} seed {seed} done"
            if value.test is not None:
                status += f": test MAP@R {value.test['mean_average_precision_at_r']:.3f}"
        self.bar.set_postfix_str(f"{status}; {self.estimate()}", refresh=True)

    def cost(self, job):
        """``job``'s estimated seconds, for the order of the runs (scheduler.next_job): its
        loss's mean epoch seconds so far times the maximum epochs; None before the loss's
        first epoch."""
        seconds = self.epoch_seconds.get(job[0])
        return None if not seconds else self.config.epochs * _mean(seconds, 0.0)

    def estimate(self):
        if not self.epoch_seconds:
            return "time left: estimated after the first epochs"
        seen = [s for seconds in self.epoch_seconds.values() for s in seconds]
        fallback = sum(seen) / len(seen)
        work = sum(
            epochs * _mean(self.epoch_seconds.get(name), fallback) for (name, _), epochs in self.left.items()
        )
        return f"time left ≤ ~{_minutes(work / self.workers)} at this speed"

    def close(self):
        self.bar.close()


def _mean(values, fallback):
    return sum(values) / len(values) if values else fallback


def _minutes(seconds):
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def run_all(inputs, config, out_dir, file=None, jobs=None, test=True, backend=scheduler.run_jobs):
    """Every (loss, seed) of ``config`` with the untrained row (or the (loss,
    seed) ``jobs`` given). A run whose result.json exists is loaded, not
    recomputed; a run folder without a valid one (a killed run) starts afresh.
    Runs go to ``number_of_workers`` processes through ``backend`` (the
    scheduler's run_jobs signature), the longest first once their losses' epochs
    have been timed (``Progress.cost``). ``test=False``: no test evaluation.
    Returns the RunResults in job order, the untrained row repeated for every
    seed when it was computed once."""
    file = file or sys.stderr
    out_dir = Path(out_dir)
    frozen = getattr(inputs, "seed_independent", False)
    jobs = [tuple(job) for job in (jobs if jobs is not None else all_jobs(config, frozen))]
    split = getattr(inputs, "split", None)
    done = finished(out_dir, jobs, file, None if split is None else split.test_labels)
    todo = [job for job in jobs if job not in done]
    if done:
        print(f"resuming: {len(done)} of {len(jobs)} runs already finished in {out_dir}", file=file)
    if todo:
        workers = number_of_workers(config, len(todo))
        tqdm.tqdm.monitor_interval = 0  # no monitor thread: nothing threaded to fork
        progress = Progress(todo, config, workers, file)
        try:
            shared = Shared(inputs, config, out_dir, test)
            results = backend(execute_run, shared, todo, workers, progress, cost=progress.cost)
        finally:
            progress.close()
        done.update(zip(todo, results))
    results = [done[job] for job in jobs]
    if jobs and jobs[0] == (UNTRAINED, 0) and frozen:
        untrained = [dataclasses.replace(done[jobs[0]], seed=seed) for seed in range(1, config.seeds)]
        results = results[:1] + untrained + results[1:]
    return results

"""Trial executors: what runs the trials and reproductions of the Bayesian optimisation
(BayesOptRunner) for it. The optimisation gives an executor jobs and takes their results
back; the executor runs them on warm runners (``WarmRunner``: a trial runner,
sub_experiments.TrialRunner, built once by the launcher's ``factory.trial_runner()`` and
kept), and knows nothing of the optimisation.

Every executor has:

- ``start(folder)``: get ready (``folder``: the optimisation's experiment folder);
- ``free``: how many more jobs it takes now; ``len()``: the jobs in flight;
- ``submit(method, job)``: run ``trial_runner.<method>(job)`` (``run_trial`` or ``reproduce``);
- ``next_done()``: ``(job, result, seconds)`` of a job that finished, ``seconds`` the
  job's own duration on its runner (without the optimisation's work between jobs);
- ``close()``: end its workers; idempotent.

``SequentialTrials`` (``--parallel_trials 1``) runs one job at a time on a warm runner in
this process; parallel.RayTrials runs K at a time on K warm runners in Ray workers
(parallel.TrialWorker). Both keep the runner, the imports and what the process caches (the
emoji features) from one job to the next.
"""

import logging
import time

logger = logging.getLogger(__name__)
# the log lines of the launcher and of the Ray workers (bench_parallel_sweep.py reads their times)
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


def set_threads(threads):
    """torch's threads for the jobs (None: keep the process's)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


class WarmRunner:
    """A trial runner built once (``factory.trial_runner()``: torch, pb and ax imported, the
    configs read) with ``threads`` torch threads (None: the process's), which runs trials and
    reproductions one after another. Each call returns ``(result, seconds, startup)``: the
    call's duration, and on the first call the seconds the build took (else None)."""

    def __init__(self, factory, threads=None, started=None):
        """``started``: the perf_counter time the start-up began (default: now), for a
        subclass whose start-up does more before this."""
        start = time.perf_counter() if started is None else started
        set_threads(threads)
        self.runner = factory.trial_runner()
        self.startup = time.perf_counter() - start

    def _timed(self, function, job):
        start = time.perf_counter()
        result = function(job)
        startup, self.startup = self.startup, None
        return result, time.perf_counter() - start, startup

    def run_trial(self, trial):
        return self._timed(self.runner.run_trial, trial)

    def reproduce(self, job):
        return self._timed(self.runner.reproduce, job)


class SequentialTrials:
    """One job at a time, in this process: ``submit`` takes it, ``next_done`` runs it on a
    WarmRunner built when the executor starts, with ``threads`` torch threads (``--trial_cpus``;
    None: the process's, torch's default being all cores)."""

    def __init__(self, factory, threads=None):
        self.factory = factory
        self.threads = threads
        self.worker = None
        self.waiting = None  # (method, job)

    def start(self, folder):
        if self.worker is None:
            self.worker = WarmRunner(self.factory, self.threads)

    @property
    def free(self):
        return 1 - len(self)

    def __len__(self):
        return 0 if self.waiting is None else 1

    def submit(self, method, job):
        if self.waiting is not None:
            raise RuntimeError(f"{method}({job!r}) submitted while {self.waiting} waits")
        self.waiting = (method, job)

    def next_done(self):
        (method, job), self.waiting = self.waiting, None
        result, seconds, startup = getattr(self.worker, method)(job)
        if startup is not None:
            logger.info("The trial runner was built in %.1f s", startup)
        return job, result, seconds

    def close(self):
        self.worker = self.waiting = None

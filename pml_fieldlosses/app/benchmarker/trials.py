"""Trial executors: what runs the trials and reproductions of the Bayesian optimisation
(BayesOptRunner) for it. The optimisation gives an executor jobs and takes their results
back; the executor runs them on trial runners (sub_experiments.TrialRunner) of its own,
built by the launcher's ``factory.trial_runner()``, and knows nothing of the optimisation.

Every executor has:

- ``start(folder)``: get ready (``folder``: the optimisation's experiment folder);
- ``free``: how many more jobs it takes now; ``len()``: the jobs in flight;
- ``submit(method, job)``: run ``trial_runner.<method>(job)`` (``run_trial`` or ``reproduce``);
- ``next_done()``: ``(job, result, seconds)`` of a job that finished, ``seconds`` its
  duration on a worker, None where it ran in this process;
- ``close()``: end its workers; idempotent (nothing to end for SequentialTrials).

``SequentialTrials`` (``--parallel_trials 1``) runs one job at a time in this process;
parallel.RayTrials runs K at a time on warm Ray workers.
"""


class SequentialTrials:
    """One job at a time, in this process: ``submit`` takes it, ``next_done`` runs it on a
    trial runner built when the executor starts (torch with this process' threads)."""

    def __init__(self, factory):
        self.factory = factory
        self.runner = None
        self.waiting = None  # (method, job)

    def start(self, folder):
        if self.runner is None:
            self.runner = self.factory.trial_runner()

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
        return job, getattr(self.runner, method)(job), None

    def close(self):
        self.runner = self.waiting = None

"""The trial executor of Bayesian optimisation with several trials in flight:
``--parallel_trials K`` and ``--ray_address`` (trials.py says what an executor does).

ax proposes up to K trials at once; each runs on one of K warm Ray actors (``TrialWorker``,
one per slot), which imported torch, pb and ax and built a trial runner once (from the
launcher's options: the launcher's runner factory is pickled to it, the command line is
parsed once), and keeps them, with what the process caches (the dataset's features), for
the trials it runs one after another, each into its usual pb experiment folder
(``<experiment_name><i>``); the driver gives each result to ax as it comes back and starts
the next trial on the freed actor. The reproductions of the best trial run on the same
actors. The driver alone talks to ax and writes the optimisation's records, so a trial is
recorded exactly once. Each slot gets its share of the cluster's CPUs (``--trial_cpus``,
default: the CPUs / K, at most one node's) and trains with that many torch threads.

Faults: a worker that dies in the middle of a trial is restarted by Ray (its imports and
runner build run again), which runs the trial again there (up to 3 times); the trial then
resumes its folder (its finished folds are kept). A driver killed and started again with the
same command finds ax's saved state: the completed trials are kept, the trials that were
running are resumed from their folders. The experiment folder must be on storage every Ray
node sees: each worker checks it sees it before anything else (a worker that does not stops
the sweep, naming its node). See docs/cluster.md.
"""

import glob
import logging
import os
import time

from .. import cluster, cluster_slots
from .trials import LOG_FORMAT, WarmRunner

logger = logging.getLogger(__name__)


class TrialWorker(WarmRunner):
    """A Ray actor: one slot of the sweep, a trials.WarmRunner (the same warm runner as
    ``--parallel_trials 1`` in the launcher's process) with ``threads`` torch threads, which
    first checks that it sees the experiment folder (the driver's ``token`` file, see
    cluster.write_token). Each call returns ``(result, seconds, startup)``: the call's
    duration, and on the first call after the actor (re)started the seconds its start-up
    took (else None)."""

    def __init__(self, factory, threads, token):
        start = time.perf_counter()
        cluster.check_token(*token)
        logging.basicConfig(format=LOG_FORMAT, level=logging.INFO)
        super().__init__(factory, threads, started=start)


class RayTrials:
    """K trials (or reproductions) at a time on K warm Ray workers (``slots``), on the Ray
    cluster at ``address`` (None: a new local instance), each with ``gpus`` GPUs and
    ``cpus`` CPUs (None: the defaults of ``start``). ``factory`` builds the workers'
    trial runners: give one whose folders are absolute (a worker's current directory is
    not the driver's)."""

    def __init__(self, factory, slots, address=None, gpus=None, cpus=None):
        self.factory = factory
        self.slots, self.address = slots, address
        self.gpus, self.cpus = gpus, cpus
        self.workers = self.token = None

    def start(self, folder):
        """Ray (started or joined) and the K warm actors, sized to fit on the nodes and
        started side by side (``cluster.Workers`` returns once all have started); each first
        checks that it sees ``folder`` (the token file stays there while they live, for
        actors that Ray restarts)."""
        if self.workers is not None:
            return
        start = time.perf_counter()
        ray = cluster.connect(self.address)
        logger.info("Ray: connected in %.1f s", time.perf_counter() - start)
        for stale in glob.glob(os.path.join(folder, ".ray-visibility-*")):  # left by a killed driver
            os.remove(stale)
        self.token = cluster.write_token(folder)
        nodes = cluster_slots.alive_nodes(ray)
        gpus = self.gpus if self.gpus is not None else (1 if ray.cluster_resources().get("GPU", 0) else 0)
        cpus = self.cpus if self.cpus is not None else cluster_slots.slot_cpus(nodes, self.slots, gpus)
        cluster_slots.check_fit(nodes, self.slots, cpus, gpus)
        options = cluster.resources("cuda" if gpus else "cpu", num_cpus=cpus, num_gpus=gpus or None)
        threads = max(1, int(cpus))
        logger.info("Ray: %d workers, each %s and %d torch threads", self.slots, options, threads)
        self.workers = cluster.Workers(
            ray, TrialWorker, (self.factory, threads, self.token), self.slots, options
        )

    @property
    def free(self):
        return self.workers.free

    def __len__(self):
        return len(self.workers)

    def submit(self, method, job):
        self.workers.submit(method, job)

    def next_done(self):
        """(job, result, seconds on its worker) of the first call to finish."""
        job, (result, seconds, startup) = self.workers.next_done()
        if startup is not None:
            logger.info("Ray: a worker started in %.1f s (imports, runner build)", startup)
        return job, result, seconds

    def close(self):
        if self.workers is not None:
            self.workers.close()
            self.workers = None
        if self.token is not None:
            os.remove(self.token[0])
            self.token = None

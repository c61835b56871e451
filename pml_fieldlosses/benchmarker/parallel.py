"""Bayesian optimisation with several trials in flight: ``--parallel_trials K`` and
``--ray_address``.

ax proposes up to K trials at once; each runs as a Ray task that rebuilds the launcher's
runner from the same command line and runs the trial into its usual pb experiment folder
(``<experiment_name><i>``); the driver gives each result to ax as it comes back and starts
the next trial in the freed slot. The reproductions of the best trial run the same way.
The driver alone talks to ax and writes the optimisation's records, so a trial is recorded
exactly once.

Faults: a worker that dies in the middle of a trial is a system failure for Ray, which runs
the task again (up to 3 times); the trial then resumes its folder (its finished folds are
kept). A driver killed and started again with the same command finds ax's saved state: the
completed trials are kept, the trials that were running are resumed from their folders.
The experiment folder must be on storage every Ray node sees (checked before the first
trial). See docs/cluster.md.
"""

import logging
import os

from .. import cluster

logger = logging.getLogger(__name__)
PATH_OPTIONS = ("root_experiment_folder", "dataset_root", "root_config_folder", "global_db_path", "pytorch_home")


def worker_runner(argv):
    """In a Ray worker: the runner the launcher builds for ``argv`` (a context manager)."""
    from .launcher import prepared_runner

    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s: %(message)s", level=logging.INFO)
    return prepared_runner(argv)


def run_trial(job):
    """In a Ray worker: the trial's result."""
    argv, trial = job
    with worker_runner(argv) as runner:
        return runner.run_trial(trial)


def reproduce(job):
    """In a Ray worker: reproduction ``i`` of sub-experiment ``name``, and its test evaluation."""
    argv, name, i = job
    with worker_runner(argv) as runner:
        runner.reproduce_one(name, i)


class ParallelTrials:
    def __init__(self, args, launcher_argv):
        self.slots = args.parallel_trials
        self.address = args.ray_address
        self.gpus, self.cpus = args.trial_gpus, args.trial_cpus
        # the workers rebuild the runner from this command line, with the folders made absolute
        # (a worker's current directory is not the driver's)
        self.argv = list(launcher_argv)
        for option in PATH_OPTIONS:
            value = getattr(args, option)
            if value is not None:
                self.argv += [f"--{option}", os.path.abspath(value)]

    def connect(self, folder):
        ray = cluster.connect(self.address)
        cluster.check_shared_folder(ray, folder)
        gpus = self.gpus if self.gpus is not None else (1 if ray.cluster_resources().get("GPU", 0) else 0)
        options = cluster.resources("cuda" if gpus else "cpu", num_cpus=self.cpus, num_gpus=gpus or None)
        logger.info("Ray: %s per task, %d in flight", options, self.slots)
        return ray, options

    def optimise(self, runner, client, record_keeper, config_diffs):
        ray, options = self.connect(runner.root)
        tasks = cluster.Tasks(ray, run_trial, options)
        busy = set()
        try:
            while True:
                for trial in runner.next_trials(client, self.slots - len(tasks), busy):
                    runner.start_trial(trial, config_diffs)
                    tasks.submit((self.argv, trial))
                    busy.add(trial.index)
                if not len(tasks):
                    table = client.summarize()
                    done = 0 if table.empty else int((table["trial_status"] == "COMPLETED").sum())
                    if done < runner.bayes_opt_iters:
                        raise RuntimeError(f"ax proposed no new trial with none running ({done} completed)")
                    return
                (_, trial), result = tasks.next_done()
                busy.discard(trial.index)
                logger.info("Optimization iteration %d finished", trial.index)
                runner.record(client, record_keeper, trial, result)
        finally:
            tasks.cancel()

    def reproduce(self, runner, name):
        ray, options = self.connect(runner.root)
        jobs = [(self.argv, name, i) for i in runner.reproduction_indices()]
        for (_, _, i), _ in cluster.as_completed(ray, reproduce, jobs, options, max_in_flight=self.slots):
            logger.info("Reproduction %d of %s finished", i, name)

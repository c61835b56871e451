"""Builds pb's runners from the launcher's parsed command line.

The launcher parses its command line once and keeps what the runners need in a
``RunnerFactory``: pb's runner options, pb's part of the command line (``pb_argv``, see
runners.py) and the ``--register`` targets. The factory builds the launcher's runner and
the trials' runners (sub_experiments.TrialRunner); it is picklable (plain values, the
targets by name), so a Ray worker is given the factory and builds its trial runner from it.
"""

import copy
import importlib
import os

from . import compat
from .registration import register
from .runners import SingleExperimentRunner

# the options that name files or folders (made absolute for a worker, whose current
# directory is not the driver's)
PATH_OPTIONS = (
    "root_experiment_folder",
    "dataset_root",
    "root_config_folder",
    "global_db_path",
    "pytorch_home",
)


def import_target(target):
    """A module ``a.b`` or a class ``a.b.C``."""
    try:
        return importlib.import_module(target)
    except ImportError:
        module_name, _, attribute = target.rpartition(".")
        if not module_name:
            raise
        return getattr(importlib.import_module(module_name), attribute)


class RunnerFactory:
    """``options``: pb's runner options (dataset_root, root_experiment_folder,
    pytorch_home, root_config_folder, global_db_path, merge_argparse_when_resuming);
    ``pb_argv``: pb's part of the command line; ``registrations``: ``(kind, target)`` pairs
    (``--register``, checked by the launcher) registered with every runner after ours;
    ``bayes_opt_iters`` and ``reproductions`` (a list of 1 or 2 ints: range's arguments):
    the Bayesian optimisation's, if ``bayes_opt_iters > 0``."""

    def __init__(self, options, pb_argv, registrations=(), bayes_opt_iters=0, reproductions=(0,)):
        self.options = dict(options)
        self.pb_argv = list(pb_argv)
        self.registrations = list(registrations)
        self.bayes_opt_iters = bayes_opt_iters
        self.reproductions = list(reproductions)

    def with_absolute_paths(self):
        """The same factory, its files and folders as absolute paths."""
        factory = copy.deepcopy(self)
        for option in PATH_OPTIONS:
            if factory.options[option] is not None:
                factory.options[option] = os.path.abspath(factory.options[option])
        return factory

    def registered(self, runner):
        """``runner`` with our compatibility classes, losses, models and datasets, then the
        ``--register`` targets, registered."""
        register(runner)
        for kind, target in self.registrations:
            runner.register(kind, import_target(target))
        return runner

    def single_experiment_runner(self):
        """The runner of one pb experiment (no ``--bayes_opt_iters``)."""
        compat.restore_identity_in_pml()
        return self.registered(SingleExperimentRunner(pb_argv=self.pb_argv, **self.options))

    def bayes_opt_runner(self, trials):
        """The runner of the Bayesian optimisation; ``trials``: its trial executor
        (trials.SequentialTrials or parallel.RayTrials), given this factory or a copy."""
        from .bayes_opt import BayesOptRunner

        compat.restore_identity_in_pml()
        runner = BayesOptRunner(
            bayes_opt_iters=self.bayes_opt_iters,
            reproductions=self.reproductions,
            trials=trials,
            pb_argv=self.pb_argv,
            **self.options,
        )
        return self.registered(runner)

    def trial_runner(self):
        """A runner of the optimisation's trials and reproductions (in a trial executor)."""
        from .sub_experiments import TrialRunner

        compat.restore_identity_in_pml()
        return self.registered(TrialRunner(pb_argv=self.pb_argv, **self.options))

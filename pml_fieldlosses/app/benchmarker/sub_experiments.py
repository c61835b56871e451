"""The runner of pb's Bayesian optimisation's trials: one pb experiment folder per trial
(``<experiment_name><i>``), trained, resumed, evaluated on the test split and
reproduced with pb's SingleExperimentRunner.

A trial executor (trials.py, parallel.py) builds one from the launcher's options
(runner_factory.py), in the launcher's process or in a Ray worker, and runs the trials and
reproductions the optimisation gives it with ``run_trial`` and ``reproduce``.
BayesOptRunner, the optimisation itself, extends it.
"""

import copy
import logging
import os
import shutil

from easy_module_attribute_getter import utils as emag_utils
from powerful_benchmarker.runners.base_runner import BaseRunner
from powerful_benchmarker.utils import constants as const
from record_keeper.db_utils import DBManager

from ..errors import FileFault
from . import files
from .runners import GivenCommandLine, SingleExperimentRunner
from .search_space import set_at_path, take_search_space

logger = logging.getLogger(__name__)


class TrialRunner(GivenCommandLine, BaseRunner):
    """pb's runner of the sub-experiments of the optimisation ``<root_experiment_folder>/
    <experiment_name>`` (``--experiment_name`` in ``pb_argv``, pb's part of the command
    line); the other options are pb's runner options."""

    def __init__(self, pb_argv=(), **kwargs):
        super().__init__(**kwargs)
        self.pb_argv = list(pb_argv)
        self.YR = self.setup_yaml_reader()
        self.experiment_name = self.YR.args.experiment_name
        self.root = os.path.join(self.root_experiment_folder, self.experiment_name)
        if self.global_db_path is None:
            self.global_db_path = os.path.join(self.root, "bayes_opt_experiments.db")
        self.YR, self.search_space = self.read_configs()

    def read_configs(self, find_search_space=True, merge_argparse=False):
        """The experiment's configs: the saved copy in the experiment folder if there is
        one (resuming), else the config root's (then saved there, all files or none). With
        ``find_search_space``, also the search ranges, taken out of the configs (checked
        by ``check_search_space`` before anything is saved). A saved config that is not
        a YAML mapping is a FileFault naming it."""
        YR = self.setup_yaml_reader()
        resuming = os.path.isdir(YR.args.place_to_save_configs)
        if resuming:
            config_paths = self.get_saved_config_paths(YR.args)
            merge_argparse = self.merge_argparse_when_resuming or merge_argparse
            for path in (p for paths in config_paths.values() for p in paths):
                files.read_yaml(path, "saved config", files.SAVED_CONFIG_ADVICE)
        else:
            config_paths = self.get_root_config_paths(YR.args)
            merge_argparse = True
        YR.args, _, YR.args.dict_of_yamls = YR.load_yamls(
            config_paths=config_paths,
            max_merge_depth=float("inf"),
            max_argparse_merge_depth=float("inf"),
            merge_argparse=merge_argparse,
        )
        if find_search_space:
            self.check_search_space(take_search_space(copy.deepcopy(YR.args.__dict__)), resuming)
        if not resuming:
            files.write_configs(YR.args.place_to_save_configs, YR.args.dict_of_yamls)
        if find_search_space:
            return YR, take_search_space(YR.args.__dict__)
        return YR

    def check_search_space(self, parameters, resuming):
        """The search ranges are what this runner needs (any, for the trials)."""

    def sub_experiment_name(self, trial_index):
        return f"{self.experiment_name}{trial_index}"

    def sub_experiment_path(self, name):
        return os.path.join(self.root, name)

    def parameters_filename(self, name):
        return os.path.join(self.sub_experiment_path(name), "bayes_opt_parameters.yaml")

    def point_to_sub_experiment(self, args, name):
        args.experiment_name = name
        args.experiment_folder = self.sub_experiment_path(name)
        args.place_to_save_configs = os.path.join(args.experiment_folder, "configs")

    def fresh_yaml_reader(self, name):
        """A YamlReader for sub-experiment ``name`` that loads its configs itself."""
        YR = self.setup_yaml_reader()
        self.start_fresh(YR, name)
        return YR

    def start_fresh(self, YR, name):
        emag_utils.remove_dicts(YR.args.__dict__)
        YR.args.dataset_root = self.dataset_root
        self.point_to_sub_experiment(YR.args, name)

    def single_experiment_runner(self):
        runner = SingleExperimentRunner(
            root_experiment_folder=self.root,
            root_config_folder=self.YR.args.place_to_save_configs,
            dataset_root=self.dataset_root,
            pytorch_home=self.pytorch_home,
            global_db_path=self.global_db_path,
            merge_argparse_when_resuming=self.merge_argparse_when_resuming,
            pb_argv=self.pb_argv,
        )
        runner.pytorch_getter = self.pytorch_getter
        return runner

    def run_trial(self, trial):
        """pb's result of the trial's experiment (bayes_opt.Trial): (fold mean, SEM) of the
        primary metric. A trial whose folder exists is resumed (an interrupted run, or a Ray
        task run again after its worker died)."""
        if trial.resuming or os.path.isdir(self.sub_experiment_path(trial.name)):
            return self.resume_training(trial.parameters, trial.name)
        return self.run_new_experiment(trial.parameters, trial.name)

    def run_new_experiment(self, parameters, name):
        YR, _ = self.read_configs()
        for path, value in parameters.items():
            set_at_path(YR.args.__dict__, path, value)
            for config in YR.args.dict_of_yamls.values():
                set_at_path(config, path, value)
        YR.args.resume_training = None
        self.point_to_sub_experiment(YR.args, name)
        os.makedirs(YR.args.experiment_folder, exist_ok=True)
        files.write_yaml(self.parameters_filename(name), parameters)
        return self.single_experiment_runner().start_experiment(YR.args)

    def resume_training(self, parameters, name):
        YR = self.fresh_yaml_reader(name)
        YR.args.resume_training = self.resume_training_value()
        try:
            saved = files.read_yaml(self.parameters_filename(name), "trial parameters file")
        except FileFault as e:  # missing or unreadable: the folder is not known to be ax's trial
            logger.warning("%s", e)
            saved = None
        if saved == parameters:
            result = self.try_resuming(YR)
        else:
            logger.warning("The saved parameters of %s are not ax's: starting it again", name)
            self.delete_sub_experiment(name)
            result = const.RESUME_FAILURE
        if result == const.RESUME_FAILURE:
            return self.run_new_experiment(parameters, name)
        return result

    def try_resuming(self, YR, reproduction=False):
        try:
            runner = self.single_experiment_runner()
            if reproduction:
                return runner.reproduce_results(
                    YR,
                    starting_fresh_hook=lambda fresh: self.start_fresh(fresh, YR.args.experiment_name),
                    max_merge_depth=0,
                    max_argparse_merge_depth=0,
                )
            return runner.run_new_experiment_or_resume(YR)
        except Exception as e:  # noqa: BLE001 (pb: whatever stops a resume, the trial starts again)
            logger.error("Could not resume %s (%r): starting it again", YR.args.experiment_name, e)
            YR.args.resume_training = None
            self.delete_sub_experiment(YR.args.experiment_name)
            return const.RESUME_FAILURE

    def delete_sub_experiment(self, name):
        logger.warning("Deleting and starting fresh for %s", name)
        shutil.rmtree(self.sub_experiment_path(name), ignore_errors=True)
        DBManager(self.global_db_path, is_global=True).delete_experiment(name)

    def resume_training_value(self):
        return self.YR.args.resume_training or "latest"

    def test_model(self, name):
        """Test-set accuracy of sub-experiment ``name``: the fold mean (aggregator) and
        the concatenated ensemble."""
        files.check_experiment_checkpoints(self.sub_experiment_path(name), best=True)
        for flag in ("evaluate", "evaluate_ensemble"):
            YR = self.fresh_yaml_reader(name)
            setattr(YR.args, flag, True)
            YR.args.resume_training = None
            YR.args.splits_to_eval = ["test"]
            self.single_experiment_runner().run_new_experiment_or_resume(YR)

    def reproduce(self, job):
        """Reproduction i of sub-experiment ``name``, ``job = (name, i)`` (resumed if its
        folder exists), tested."""
        name, i = job
        reproduction = f"{name}_reproduction{i}"
        YR = self.fresh_yaml_reader(reproduction)
        YR.args.reproduce_results = self.sub_experiment_path(name)
        YR.args.resume_training = None
        result = const.RESUME_FAILURE
        if os.path.isdir(YR.args.experiment_folder):
            YR.args.resume_training = self.resume_training_value()
            result = self.try_resuming(YR, reproduction=True)
        if result == const.RESUME_FAILURE:
            self.single_experiment_runner().reproduce_results(
                YR,
                starting_fresh_hook=lambda fresh, name=reproduction: self.start_fresh(fresh, name),
                max_merge_depth=0,
                max_argparse_merge_depth=0,
            )
        self.test_model(reproduction)

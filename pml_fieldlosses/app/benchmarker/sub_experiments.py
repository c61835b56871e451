"""The sub-experiments of pb's Bayesian optimisation: one pb experiment folder per trial
(``<experiment_name><i>``), trained, resumed, evaluated on the test split and
reproduced with pb's SingleExperimentRunner."""

import logging
import os
import shutil

from easy_module_attribute_getter import utils as emag_utils
from powerful_benchmarker.runners.single_experiment_runner import SingleExperimentRunner
from powerful_benchmarker.utils import common_functions as pb_c_f
from powerful_benchmarker.utils import constants as const
from record_keeper.db_utils import DBManager

from .search_space import set_at_path

logger = logging.getLogger(__name__)


class SubExperiments:
    """What BayesOptRunner does with one trial's pb experiment (needs the runner's
    ``root``, ``read_configs``, ``setup_yaml_reader`` and pb's runner options)."""

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
        )
        runner.pytorch_getter = self.pytorch_getter
        return runner

    def run_new_experiment(self, parameters, name):
        YR, _ = self.read_configs()
        for path, value in parameters.items():
            set_at_path(YR.args.__dict__, path, value)
            for config in YR.args.dict_of_yamls.values():
                set_at_path(config, path, value)
        YR.args.resume_training = None
        self.point_to_sub_experiment(YR.args, name)
        os.makedirs(YR.args.experiment_folder, exist_ok=True)
        pb_c_f.write_yaml(self.parameters_filename(name), parameters, open_as="w")
        return self.single_experiment_runner().start_experiment(YR.args)

    def resume_training(self, parameters, name):
        YR = self.fresh_yaml_reader(name)
        YR.args.resume_training = self.resume_training_value()
        try:
            saved = pb_c_f.load_yaml(self.parameters_filename(name))
        except OSError:
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
        for flag in ("evaluate", "evaluate_ensemble"):
            YR = self.fresh_yaml_reader(name)
            setattr(YR.args, flag, True)
            YR.args.resume_training = None
            YR.args.splits_to_eval = ["test"]
            self.single_experiment_runner().run_new_experiment_or_resume(YR)

    def reproduction_indices(self):
        if isinstance(self.reproductions, (list, tuple)):
            return list(range(*self.reproductions))
        return list(range(self.reproductions))

    def reproduce_results(self, name):
        for i in self.reproduction_indices():
            self.reproduce_one(name, i)

    def reproduce_one(self, name, i):
        """Reproduction i of sub-experiment ``name`` (resumed if its folder exists), tested."""
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

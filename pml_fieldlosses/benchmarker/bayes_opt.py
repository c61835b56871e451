"""pb's Bayesian optimisation (``--bayes_opt_iters N``) on the current ax-platform API.

pb 0.9.33's BayesOptRunner calls ax APIs that ax removed (``AxClient`` with
``objective_name``/``minimize``, ``get_best_raw_objective_point``, ``ax.modelbridge``,
``ax.plot``); the ax version that still has them needs numpy < 2. This runner keeps pb's
behaviour with ``ax.api.Client``:

- the search space is every ``key~BAYESIAN~: [low, high]`` (``~LOG_BAYESIAN~``: log scale,
  ``~INT_BAYESIAN~``: integers) in the configs; the objective is the hook container's
  primary metric (MAP@R), maximised, observed as pb's fold mean and its standard error;
- trial i is the sub-experiment ``<experiment_name><i>``; ax's state is saved to
  ``bayes_opt_ax_logs/logNNNNN.json`` after every change, each trial's parameters,
  objective mean and SEM are recorded (table ``bayes_opt``), and an interrupted run
  resumes: finished trials are kept, the interrupted one resumes its folds;
- then ``best_parameters.yaml``, test-set evaluation of the best sub-experiment (fold
  mean and concatenated ensemble), ``--reproductions`` retrainings of it, and
  ``report_*.yaml`` / ``detailed_report_*.yaml`` with means and 95 % confidence intervals
  over the best run and its reproductions; ``optimization_plots.html`` shows ax's plots.

The search ranges are fixed when the optimisation starts (the configs are saved in the
experiment folder and read from there when resuming).
"""

import collections
import glob
import html
import logging
import math
import os
import shutil

import numpy as np
import plotly.io
from ax.analysis.plotly.parallel_coordinates import ParallelCoordinatesPlot
from ax.analysis.plotly.plotly_analysis import PlotlyAnalysisCard
from ax.analysis.plotly.top_surfaces import TopSurfacesAnalysis
from ax.analysis.plotly.utility_progression import UtilityProgressionAnalysis
from ax.api.client import Client
from ax.api.configs import RangeParameterConfig
from easy_module_attribute_getter import utils as emag_utils
from powerful_benchmarker.runners.base_runner import BaseRunner
from powerful_benchmarker.runners.single_experiment_runner import SingleExperimentRunner
from powerful_benchmarker.utils import common_functions as pb_c_f
from powerful_benchmarker.utils import constants as const
from record_keeper.db_utils import DBManager

from ..utils.stats import mean_ci
from .compat import get_legacy_record_keeper

logger = logging.getLogger(__name__)

# keyword -> (ax parameter type, scaling)
SEARCH_KEYWORDS = {
    "~BAYESIAN~": ("float", "linear"),
    "~LOG_BAYESIAN~": ("float", "log"),
    "~INT_BAYESIAN~": ("int", "linear"),
}
RECORD_TABLE = "bayes_opt"
# columns of the evaluation records that are not accuracies (record-keeper >= 0.9.31 adds ~iteration~)
REPORT_EXCLUDED_PREFIXES = (
    const.TRAINED_STATUS_COL_NAME,
    "epoch",
    "SEM",
    "id",
    "experiment_id",
    "timestamp",
    "~",
)


def take_search_space(config, path=()):
    """The search parameters of a config dict (keys ending in a SEARCH_KEYWORDS entry,
    named by their path joined with '/'), removing the keyword from those keys in place,
    also inside ``dict_of_yamls`` (whose parameters are the same ones)."""
    parameters = []
    for key in list(config):
        value = config[key]
        if isinstance(value, dict):
            inner = take_search_space(value, path + (key,))
            if key != "dict_of_yamls" and "dict_of_yamls" not in path:
                parameters += inner
            continue
        for keyword, (parameter_type, scaling) in SEARCH_KEYWORDS.items():
            if key.endswith(keyword):
                name = key[: -len(keyword)]
                if not (isinstance(value, (list, tuple)) and len(value) == 2):
                    raise ValueError(f"{'/'.join(path + (key,))} must be a range [low, high], got {value!r}")
                cast = int if parameter_type == "int" else float
                bounds = (cast(value[0]), cast(value[1]))
                parameters.append(
                    RangeParameterConfig(
                        name="/".join(path + (name,)),
                        bounds=bounds,
                        parameter_type=parameter_type,
                        scaling=scaling,
                    )
                )
                config[name] = config.pop(key)
                break
    return parameters


def set_at_path(config, path, value):
    """Set config[a][b][c] = value for path 'a/b/c' if that path exists."""
    *parents, last = path.split("/")
    for key in parents:
        config = config.get(key)
        if not isinstance(config, dict):
            return
    if last in config:
        config[last] = value


def as_raw_data(metric, result):
    """pb's experiment result (mean, SEM) over folds, or the mean of a single fold, as ax data."""
    mean, sem = result if isinstance(result, tuple) else (result, None)
    if sem is None or not math.isfinite(float(sem)):
        return {metric: float(mean)}
    return {metric: (float(mean), float(sem))}


def plain(value):
    """numpy scalars as Python numbers (for YAML)."""
    return value.item() if isinstance(value, np.generic) else value


def confidence_interval(values):
    """mean and 95 % t-interval of a list of numbers (NaN for a single number, the mean
    itself for equal numbers)."""
    mean, half_width = mean_ci(values)
    return {
        "mean": mean,
        "95%_confidence_interval": [mean - half_width, mean + half_width],
        "95%_confidence_interval_width": half_width,
    }


class BayesOptRunner(BaseRunner):
    def __init__(self, bayes_opt_iters, reproductions, **kwargs):
        super().__init__(**kwargs)
        self.bayes_opt_iters = bayes_opt_iters
        self.reproductions = reproductions
        self.YR = self.setup_yaml_reader()
        self.experiment_name = self.YR.args.experiment_name
        self.root = os.path.join(self.root_experiment_folder, self.experiment_name)
        if self.global_db_path is None:
            self.global_db_path = os.path.join(self.root, "bayes_opt_experiments.db")
        self.csv_folder = os.path.join(self.root, "bayes_opt_record_keeper_logs")
        self.tensorboard_folder = os.path.join(self.root, "bayes_opt_tensorboard_logs")
        self.ax_log_folder = os.path.join(self.root, "bayes_opt_ax_logs")
        self.best_parameters_filename = os.path.join(self.root, "best_parameters.yaml")
        self.most_recent_parameters_filename = os.path.join(self.root, "most_recent_parameters.yaml")
        self.plots_filename = os.path.join(self.root, "optimization_plots.html")
        self.YR, self.search_space = self.read_configs()
        if len(self.search_space) == 0:
            raise ValueError(
                "--bayes_opt_iters needs at least one search range in the configs "
                "(a key ending in ~BAYESIAN~, ~LOG_BAYESIAN~ or ~INT_BAYESIAN~)"
            )
        self.primary_metric = pb_c_f.first_val_of_dict(self.YR.args.hook_container)["primary_metric"]

    # ---------------------------------------------------------------- configs
    def read_configs(self, find_search_space=True, merge_argparse=False):
        """The experiment's configs: the saved copy in the experiment folder if there is
        one (resuming), else the config root's (then saved there)."""
        YR = self.setup_yaml_reader()
        resuming = os.path.isdir(YR.args.place_to_save_configs)
        if resuming:
            config_paths = self.get_saved_config_paths(YR.args)
            merge_argparse = self.merge_argparse_when_resuming or merge_argparse
        else:
            config_paths = self.get_root_config_paths(YR.args)
            merge_argparse = True
        YR.args, _, YR.args.dict_of_yamls = YR.load_yamls(
            config_paths=config_paths,
            max_merge_depth=float("inf"),
            max_argparse_merge_depth=float("inf"),
            merge_argparse=merge_argparse,
        )
        if not resuming:
            pb_c_f.save_config_files(YR.args.place_to_save_configs, YR.args.dict_of_yamls, False, [])
        if find_search_space:
            return YR, take_search_space(YR.args.__dict__)
        return YR

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

    # ---------------------------------------------------------------- ax state
    def log_paths(self):
        return sorted(glob.glob(os.path.join(self.ax_log_folder, "log*.json")), reverse=True)

    def get_client(self):
        for path in self.log_paths():
            try:
                return Client.load_from_json_file(filepath=path)
            except (OSError, ValueError) as e:
                logger.warning("Could not load %s (%r), trying an older ax log", path, e)
        client = Client()
        client.configure_experiment(parameters=self.search_space, name=self.experiment_name)
        client.configure_optimization(objective=self.primary_metric)
        return client

    def save_client(self, client):
        os.makedirs(self.ax_log_folder, exist_ok=True)
        client.save_to_json_file(
            filepath=os.path.join(self.ax_log_folder, f"log{len(self.log_paths()):05d}.json")
        )

    def trial_row(self, client, trial_index):
        """ax's summary of a trial (None if there is no such trial yet): trial_index,
        arm_name, trial_status, generation_node, the objective mean (once completed) and
        the parameters."""
        table = client.summarize()
        if table.empty:
            return None
        rows = table[table["trial_index"] == trial_index].to_dict("records")
        return rows[0] if rows else None

    def trial_parameters(self, row):
        return {p.name: plain(row[p.name]) for p in self.search_space}

    # ---------------------------------------------------------------- run
    def run(self):
        client = self.get_client()
        record_keeper = get_legacy_record_keeper(
            csv_folder=self.csv_folder, tensorboard_folder=self.tensorboard_folder
        )
        config_diffs = self.read_configs(find_search_space=False)
        for i in range(self.bayes_opt_iters):
            row = self.trial_row(client, i)
            if row is not None and row["trial_status"] == "COMPLETED":
                continue
            logger.info("Optimization iteration %d", i)
            # save config diffs (resuming with --merge_argparse_when_resuming), if any
            pb_c_f.save_config_files(
                self.YR.args.place_to_save_configs, config_diffs.args.dict_of_yamls, True, [i]
            )
            name = self.sub_experiment_name(i)
            if row is not None:
                parameters = self.trial_parameters(row)
                result = self.resume_training(parameters, name)
            else:
                ((trial_index, parameters),) = client.get_next_trials(max_trials=1).items()
                if trial_index != i:
                    raise RuntimeError(f"ax made trial {trial_index}, expected trial {i}")
                parameters = {k: plain(v) for k, v in parameters.items()}
                self.save_client(client)
                pb_c_f.write_yaml(
                    self.most_recent_parameters_filename,
                    {"parameters": parameters, "trial_index": i},
                    open_as="w",
                )
                result = self.run_new_experiment(parameters, name)
            client.complete_trial(trial_index=i, raw_data=as_raw_data(self.primary_metric, result))
            self.save_client(client)
            self.update_records(record_keeper, client, i, result)
            self.plot_progress(client)

        logger.info("DONE BAYESIAN OPTIMIZATION")
        best_name = self.save_best_parameters(record_keeper, client)
        self.test_model(best_name)
        self.reproduce_results(best_name)
        self.create_accuracy_report(best_name)
        logger.info("##### FINISHED #####")

    def update_records(self, record_keeper, client, trial_index, result):
        row = self.trial_row(client, trial_index)
        row = {k.replace("/", "_"): plain(v) for k, v in row.items()}
        if isinstance(result, tuple):
            row[f"SEM_{self.primary_metric}"] = float(result[1])
        record_keeper.update_records(row, global_iteration=trial_index, parent_name=RECORD_TABLE)
        record_keeper.save_records()

    def save_best_parameters(self, record_keeper, client):
        metric = self.primary_metric
        best = dict(
            record_keeper.query(
                f"SELECT * FROM {RECORD_TABLE} WHERE {metric}=(SELECT max({metric}) FROM {RECORD_TABLE})"
            )[0]
        )
        trial_index = int(best["trial_index"])
        name = self.sub_experiment_name(trial_index)
        logger.info("BEST SUB EXPERIMENT NAME: %s", name)
        _, ax_best, _, _ = client.get_best_parameterization(use_model_predictions=False)
        ax_mean = ax_best[metric][0] if isinstance(ax_best[metric], tuple) else ax_best[metric]
        if not np.isclose(ax_mean, best[metric]):
            raise RuntimeError(f"ax's best {metric} {ax_mean} is not the best recorded one {best[metric]}")
        sem = best.get(f"SEM_{metric}")
        parameters = self.trial_parameters(self.trial_row(client, trial_index))
        pb_c_f.write_yaml(
            self.best_parameters_filename,
            {
                "best_sub_experiment_name": name,
                "best_parameters": parameters,
                "best_values": {
                    metric: {"mean": float(best[metric]), "SEM": None if sem is None else float(sem)}
                },
            },
            open_as="w",
        )
        return name

    def plot_progress(self, client):
        """ax's optimisation trace, parallel coordinates and (once a model is fitted)
        response surfaces, in one HTML file (plotly.js included once, works offline)."""
        cards = client.compute_analyses(
            analyses=[UtilityProgressionAnalysis(), ParallelCoordinatesPlot(), TopSurfacesAnalysis()],
            display=False,
        )
        parts = [f"<h1>{html.escape(self.experiment_name)}</h1>"]
        include_plotlyjs = True
        for card in (c for group in cards for c in group.flatten()):
            parts.append(f"<h2>{html.escape(card.title)}</h2><p>{html.escape(card.subtitle)}</p>")
            if isinstance(card, PlotlyAnalysisCard):
                figure = card.get_figure()
                parts.append(plotly.io.to_html(figure, include_plotlyjs=include_plotlyjs, full_html=False))
                include_plotlyjs = False
        with open(self.plots_filename, "w", encoding="utf-8") as f:
            f.write('<html><head><meta charset="utf-8"></head><body>' + "\n".join(parts) + "</body></html>")

    # ---------------------------------------------------------------- sub-experiments
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

    def reproduce_results(self, name):
        if isinstance(self.reproductions, (list, tuple)):
            indices = range(*self.reproductions)
        else:
            indices = range(self.reproductions)
        for i in indices:
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

    # ---------------------------------------------------------------- report
    def create_accuracy_report(self, name):
        """report_<records>.yaml: per trained status, the mean and 95 % confidence
        interval of each test accuracy over sub-experiment ``name`` and its reproductions;
        detailed_report_<records>.yaml: the rows they come from."""
        YR = self.read_configs(find_search_space=False, merge_argparse=True)
        api_parser = self.get_api_parser(YR.args)
        db = DBManager(self.global_db_path, is_global=True)
        experiments = [name] + [
            os.path.basename(p)
            for p in sorted(glob.glob(os.path.join(self.root, f"{name}_reproduction*")))
            if os.path.basename(p)[len(name) + len("_reproduction") :].isdigit()
        ]
        statuses = (const.UNTRAINED_TRUNK, const.UNTRAINED_TRUNK_AND_EMBEDDER, const.TRAINED)
        for category in ("aggregator", "ensemble"):
            table = api_parser.get_eval_record_name_dict(split_names=["test"], for_inner_obj=category)["test"]
            base_name = pb_c_f.first_val_of_dict(api_parser.get_eval_record_name_dict(for_inner_obj=category))
            details = {}
            values = collections.defaultdict(lambda: collections.defaultdict(list))
            for experiment in experiments:
                experiment_id = db.get_experiment_id(experiment)
                details[experiment] = {}
                for status in statuses:
                    rows = db.query(
                        f"SELECT * FROM {table} WHERE experiment_id=? AND {const.TRAINED_STATUS_COL_NAME}=? "
                        "ORDER BY id DESC LIMIT 1",
                        (experiment_id, status),
                    )
                    if not rows:
                        continue
                    row = dict(rows[0])
                    details[experiment][status] = row
                    for key, value in row.items():
                        if value is not None and not key.startswith(REPORT_EXCLUDED_PREFIXES):
                            values[status][key].append(value)
            summary = {
                status: {key: confidence_interval(v) for key, v in accuracies.items()}
                for status, accuracies in values.items()
            }
            pb_c_f.write_yaml(
                os.path.join(self.root, f"detailed_report_{base_name}.yaml"), details, open_as="w"
            )
            pb_c_f.write_yaml(os.path.join(self.root, f"report_{base_name}.yaml"), summary, open_as="w")

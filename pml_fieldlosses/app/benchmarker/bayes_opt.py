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

The loop (``run``) is: propose trials (or take up unfinished ones: ``next_trials``) while
the trial executor has room, give them to it, record each result as it comes back
(``record``); then ``report``. Trials are independent pb experiments: the executor runs
them one after another in this process (trials.SequentialTrials, ``--parallel_trials 1``)
or K at a time on warm Ray workers (parallel.RayTrials), each on a warm runner that times
it; it only runs what it is given.

The search ranges are fixed when the optimisation starts (the configs are saved in the
experiment folder and read from there when resuming).
"""

import collections
import glob
import logging
import os

import numpy as np
from ax.api.client import Client
from powerful_benchmarker.utils import common_functions as pb_c_f

from ..errors import FileFault, UsageError, file_fault
from . import files, reports
from .records import get_legacy_record_keeper
from .search_space import as_raw_data, plain
from .sub_experiments import TrialRunner

logger = logging.getLogger(__name__)

RECORD_TABLE = "bayes_opt"
# one optimisation step: ax's trial index, its sub-experiment, parameters, and whether
# it was started before (an interrupted run) and is taken up again
Trial = collections.namedtuple("Trial", "index name parameters resuming")


class BayesOptRunner(TrialRunner):
    """``trials``: the trial executor (trials.SequentialTrials or parallel.RayTrials) that
    runs the trials and the reproductions; the other options are TrialRunner's."""

    def __init__(self, bayes_opt_iters, reproductions, trials, **kwargs):
        super().__init__(**kwargs)
        self.bayes_opt_iters = bayes_opt_iters
        self.reproductions = reproductions
        self.trials = trials
        self.csv_folder = os.path.join(self.root, "bayes_opt_record_keeper_logs")
        self.tensorboard_folder = os.path.join(self.root, "bayes_opt_tensorboard_logs")
        self.ax_log_folder = os.path.join(self.root, "bayes_opt_ax_logs")
        self.best_parameters_filename = os.path.join(self.root, "best_parameters.yaml")
        self.most_recent_parameters_filename = os.path.join(self.root, "most_recent_parameters.yaml")
        self.plots_filename = os.path.join(self.root, "optimization_plots.html")
        self.primary_metric = pb_c_f.first_val_of_dict(self.YR.args.hook_container)["primary_metric"]

    def check_search_space(self, parameters, resuming):
        """--bayes_opt_iters needs search ranges: refused before the configs are saved."""
        if parameters:
            return
        if resuming:
            raise UsageError(
                f"--bayes_opt_iters: the configs saved in {os.path.join(self.root, 'configs')} have no search "
                "range: this experiment was not started as a Bayesian optimisation; choose another "
                "--experiment_name"
            )
        raise UsageError(
            "--bayes_opt_iters needs at least one search range in the configs (a key ending in ~BAYESIAN~, "
            "~LOG_BAYESIAN~ or ~INT_BAYESIAN~), e.g. --config_loss_and_miners [mean_field_contrastive_bayes_opt]"
        )

    # ---------------------------------------------------------------- ax state
    def log_paths(self):
        return sorted(glob.glob(os.path.join(self.ax_log_folder, "log*.json")), reverse=True)

    def get_client(self):
        """ax's state: the newest readable log (a log cut short by a killed run is skipped
        with a warning); a new optimisation if there is none. Logs that all fail to load
        are a FileFault: starting again would replace the trials they record."""
        paths = self.log_paths()
        for path in paths:
            try:
                return Client.load_from_json_file(filepath=path)
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning("Could not load %s (%r), trying an older ax log", path, e)
        if paths:
            raise FileFault(
                f"none of the {len(paths)} ax logs in {self.ax_log_folder} can be read (the optimisation's "
                "state): restore them, or move the experiment folder away to start the optimisation again"
            )
        client = Client()
        client.configure_experiment(parameters=self.search_space, name=self.experiment_name)
        client.configure_optimization(objective=self.primary_metric)
        return client

    def save_client(self, client):
        """ax's state as a new log, written whole (a temporary file, hidden from
        ``log_paths``, takes the log's name at the end)."""
        path = os.path.join(self.ax_log_folder, f"log{len(self.log_paths()):05d}.json")
        tmp = os.path.join(self.ax_log_folder, f".{os.path.basename(path)}.tmp")
        try:
            os.makedirs(self.ax_log_folder, exist_ok=True)
            client.save_to_json_file(filepath=tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise file_fault(e, path, "writing ax's state") from e

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

    # ---------------------------------------------------------------- the loop
    def run(self):
        client = self.get_client()
        record_keeper = get_legacy_record_keeper(
            csv_folder=self.csv_folder, tensorboard_folder=self.tensorboard_folder
        )
        config_diffs = self.read_configs(find_search_space=False)
        try:
            self.trials.start(self.root)
            self.optimise(client, record_keeper, config_diffs)
            logger.info("DONE BAYESIAN OPTIMIZATION")
            self.report(record_keeper, client)
        finally:  # the executor's workers (and their token file) end with the run, whatever stops it
            self.trials.close()
        logger.info("##### FINISHED #####")

    def optimise(self, client, record_keeper, config_diffs):
        """Give the executor the trials left (``next_trials``) while it has room, and record
        each result as it comes back, until the ``bayes_opt_iters`` trials are completed."""
        busy = set()  # the indices of the trials in flight
        while True:
            for trial in self.next_trials(client, self.trials.free, busy):
                self.start_trial(trial, config_diffs)
                self.trials.submit("run_trial", trial)
                busy.add(trial.index)
            if not len(self.trials):
                table = client.summarize()
                done = 0 if table.empty else int((table["trial_status"] == "COMPLETED").sum())
                if done < self.bayes_opt_iters:
                    raise RuntimeError(f"ax proposed no new trial with none running ({done} completed)")
                return
            trial, result, seconds = self.trials.next_done()
            busy.discard(trial.index)
            if seconds is not None:  # the trial's own time, without ax's and the records' between trials
                logger.info("Optimization iteration %d finished (%.1f s on its runner)", trial.index, seconds)
            self.record(client, record_keeper, trial, result)

    def next_trials(self, client, count, busy=()):
        """Up to ``count`` of the ``bayes_opt_iters`` trials that are neither completed nor
        in ``busy`` (indices in flight): first those ax made before this run was
        interrupted (resumed), then new ones (``propose``); [] when none is left."""
        table = client.summarize()
        statuses = {} if table.empty else dict(zip(table["trial_index"], table["trial_status"]))
        trials = []
        for i in range(self.bayes_opt_iters):
            if len(trials) == count:
                return trials
            if i in statuses and statuses[i] != "COMPLETED" and i not in busy:
                parameters = self.trial_parameters(self.trial_row(client, i))
                trials.append(Trial(i, self.sub_experiment_name(i), parameters, resuming=True))
        new = min(count - len(trials), self.bayes_opt_iters - len(statuses))
        return trials + (self.propose(client, len(statuses), new) if new > 0 else [])

    def propose(self, client, first_index, count=1):
        """Up to ``count`` new trials from ax (indices first_index, first_index + 1, ...):
        ax may make fewer (e.g. when its model needs the results of the running ones)."""
        proposed = client.get_next_trials(max_trials=count)
        expected = list(range(first_index, first_index + len(proposed)))
        if sorted(proposed) != expected:
            raise RuntimeError(f"ax made trials {sorted(proposed)}, expected {expected}")
        self.save_client(client)
        trials = []
        for index in expected:
            parameters = {k: plain(v) for k, v in proposed[index].items()}
            files.write_yaml(
                self.most_recent_parameters_filename, {"parameters": parameters, "trial_index": index}
            )
            trials.append(Trial(index, self.sub_experiment_name(index), parameters, resuming=False))
        return trials

    def start_trial(self, trial, config_diffs):
        logger.info("Optimization iteration %d", trial.index)
        # save config diffs (resuming with --merge_argparse_when_resuming), if any
        pb_c_f.save_config_files(
            self.YR.args.place_to_save_configs, config_diffs.args.dict_of_yamls, True, [trial.index]
        )

    def record(self, client, record_keeper, trial, result):
        client.complete_trial(trial_index=trial.index, raw_data=as_raw_data(self.primary_metric, result))
        self.save_client(client)
        row = {k.replace("/", "_"): plain(v) for k, v in self.trial_row(client, trial.index).items()}
        if isinstance(result, tuple):
            row[f"SEM_{self.primary_metric}"] = float(result[1])
        record_keeper.update_records(row, global_iteration=trial.index, parent_name=RECORD_TABLE)
        record_keeper.save_records()
        reports.plot_progress(client, self.plots_filename, self.experiment_name)

    # ---------------------------------------------------------------- report
    def report(self, record_keeper, client):
        """best_parameters.yaml, the test evaluation of the best trial, its reproductions,
        and the reports over the best trial and its reproductions."""
        best_name = self.save_best_parameters(record_keeper, client)
        self.test_model(best_name)
        try:
            self.reproduce_best(best_name)
        finally:  # the reports need no workers
            self.trials.close()
        YR = self.read_configs(find_search_space=False, merge_argparse=True)
        reproductions = [
            os.path.basename(p)
            for p in sorted(glob.glob(os.path.join(self.root, f"{best_name}_reproduction*")))
            if os.path.basename(p)[len(best_name) + len("_reproduction") :].isdigit()
        ]
        reports.accuracy_report(
            self.get_api_parser(YR.args), self.global_db_path, [best_name] + reproductions, self.root
        )

    def reproduction_indices(self):
        if isinstance(self.reproductions, (list, tuple)):
            return list(range(*self.reproductions))
        return list(range(self.reproductions))

    def reproduce_best(self, name):
        """The reproductions of the best sub-experiment ``name``, by the trial executor."""
        waiting = [(name, i) for i in reversed(self.reproduction_indices())]
        while waiting or len(self.trials):
            while waiting and self.trials.free:
                self.trials.submit("reproduce", waiting.pop())
            (_, i), _, seconds = self.trials.next_done()
            if seconds is not None:
                logger.info("Reproduction %d of %s finished (%.1f s on its runner)", i, name, seconds)

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
        files.write_yaml(
            self.best_parameters_filename,
            {
                "best_sub_experiment_name": name,
                "best_parameters": parameters,
                "best_values": {
                    metric: {"mean": float(best[metric]), "SEM": None if sem is None else float(sem)}
                },
            },
        )
        return name

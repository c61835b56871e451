"""powerful-benchmarker runs end to end on CPU, through the launcher (``python -m
pml_fieldlosses.app.benchmarker``, in subprocesses) on real data (a 48- or 96-class emoji
subset as frozen EfficientNet-Lite0 features, built from npm into the bench's cache on first
use): 4 class-disjoint folds of 2 short epochs, a loss with learnable parameters; killed
after the first fold and resumed; then --evaluate (twice: no duplicate records) and
--evaluate_ensemble on the test split; Bayesian optimisation with a resumed second
trial, a reproduction and its reports; the DRML head."""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest

from .pb_support import check_trial_value, npm_skip, pb_skip

MISSING, pb_mark = pb_skip("powerful_benchmarker", "torchvision", "ax")
pytestmark = [pb_mark, npm_skip()]
if not MISSING:
    import yaml

FOLDS = [f"Test50_50_Partitions4_{i}" for i in range(4)]
ACCURACIES = "accuracies_normalized_GlobalEmbeddingSpaceTester_level_0_{}_vs_self"
MAP_R = "mean_average_precision_at_r_level0"


def data(num_classes, samples_per_epoch):
    """Real data: the first num_classes emoji classes (google and twitter images, built from npm
    into the bench's cache on first use) as cached frozen EfficientNet-Lite0 features, 2 epochs
    (config_general/quick). pb reads the command line as a shell splits it: "{key:" "value}" are
    two arguments."""
    return [
        "--config_dataset", "[default,", "emoji_features]",
        "--dataset~APPLY~2", "{vendors:", "[google,", "twitter],", "num_classes:", f"{num_classes}}}",
        "--config_general", "[default,", "quick]",
        "--config_eval", "[default,", "quick]",
        "--sampler~APPLY~2", "{length_before_new_iter:", f"{samples_per_epoch}}}",
    ]  # fmt: skip


DATA = data(48, 320)
# our FeatureInput trunk and a linear embedder
QUICK = [*DATA, "--config_models", "[default,", "emoji_features]"]
TRAIN = [
    "--config_loss_and_miners", "[mean_field_contrastive]",
    "--config_optimizers", "[default,", "emoji_features,", "mean_fields]",
]  # fmt: skip
# The killed and resumed run and the Bayesian optimisation (whose best step is evaluated on the
# test split, reproduced and reported): the first 96 classes (12 validation classes, 24 images
# per fold) and 2 epochs of 20 iterations. pb selects a fold's best validation epoch, the earliest of
# equals, and --evaluate refuses a fold whose selected epoch is 0 (the untrained embedder). On
# QUICK's 48 classes (6 validation classes, 12 images: MAP@R moves in steps of 1/12) with 10
# iterations, the trained epochs of a fold led epoch 0 by as little as 2 images in 8 measured
# folds and now and then not at all, with the random initialisation and batches of the run.
RESUMED = [
    *data(96, 640), "--config_models", "[default,", "emoji_features]",
    "--trainer~APPLY~2", "{iterations_per_epoch:", "20}",
]  # fmt: skip
TIMEOUT = 600


def launcher_command(folder, *args):
    return [
        sys.executable,
        "-m",
        "pml_fieldlosses.app.benchmarker",
        "--root_experiment_folder",
        str(folder),
        *args,
    ]


def environment():
    # one thread per process: the machine's cores are shared with other test processes
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_launcher(folder, *args, log_name):
    with open(folder / log_name, "w") as log:
        done = subprocess.run(
            launcher_command(folder, *args), stdout=log, stderr=subprocess.STDOUT, env=environment(),
            cwd=folder, timeout=TIMEOUT, check=False,
        )  # fmt: skip
    output = (folder / log_name).read_text()
    assert done.returncode == 0, output[-5000:]
    return output


def rows(db, table):
    with closing(sqlite3.connect(db)) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(r) for r in connection.execute(f"SELECT * FROM {table} ORDER BY id")]


def has_rows(db, table):
    """Whether a (possibly still being written) record database has rows in table."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as connection:
            return connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def fold_rows(experiment, fold):
    return rows(experiment / fold / "saved_csvs" / "logs.db", ACCURACIES.format("VAL"))


def file_states(folder):
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.iterdir())}


def run_and_kill(folder, *args, log_name, started_db):
    """Run the launcher and kill it (SIGKILL) once the evaluation records in started_db
    have a row (records go to the CSV file, then to that database, which is what pb reads
    back); fails if the run ends first."""
    with open(folder / log_name, "w") as log:
        process = subprocess.Popen(
            launcher_command(folder, *args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment(),
            cwd=folder,
        )
        deadline = time.monotonic() + TIMEOUT
        while process.poll() is None and time.monotonic() < deadline:
            if has_rows(started_db, ACCURACIES.format("VAL")):
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL, (folder / log_name).read_text()[-5000:]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """A 4-fold run killed once the second fold has started, resumed, then evaluated."""
    folder = tmp_path_factory.mktemp("pb_run")
    experiment = folder / "mfc"
    args = ["--experiment_name", "mfc", *RESUMED, *TRAIN]
    run_and_kill(
        folder, *args, log_name="first.log", started_db=experiment / FOLDS[1] / "saved_csvs" / "logs.db"
    )
    killed = {
        "fold0_models": file_states(experiment / FOLDS[0] / "saved_models"),
        "fold0_rows": fold_rows(experiment, FOLDS[0]),
        "meta_logs": sorted(p.name for p in (experiment / "meta_logs" / "saved_csvs").glob("*.csv")),
    }
    logs = {"resumed": run_launcher(folder, *args, "--resume_training", "latest", log_name="resumed.log")}
    # evaluated twice: the second run adds no duplicate records
    evaluate = ["--experiment_name", "mfc", "--evaluate", "--splits_to_eval", "[test]"]
    logs["evaluate"] = run_launcher(folder, *evaluate, log_name="evaluate.log")
    logs["evaluate_again"] = run_launcher(folder, *evaluate, log_name="evaluate2.log")
    ensemble = ["--experiment_name", "mfc", "--evaluate_ensemble", "--splits_to_eval", "[test]"]
    logs["ensemble"] = run_launcher(folder, *ensemble, log_name="ensemble.log")
    return experiment, killed, logs


def test_resume_after_kill_recomputes_and_loses_nothing(experiment):
    experiment, killed, logs = experiment
    assert killed["fold0_rows"] and killed["meta_logs"] == []  # killed after fold 0, before the end
    assert file_states(experiment / FOLDS[0] / "saved_models") == killed["fold0_models"]
    assert fold_rows(experiment, FOLDS[0]) == killed["fold0_rows"]
    # folds 1 to 3 are trained after the resume (fold 1 from its first epoch or later), fold 0 is not
    first_epochs = [line for line in logs["resumed"].splitlines() if "TRAINING EPOCH 1" in line]
    assert 2 <= len(first_epochs) <= 3
    for fold in FOLDS:
        epochs = [r["epoch"] for r in fold_rows(experiment, fold)]
        assert epochs == [-1, 0, 1, 2], fold  # each epoch evaluated exactly once
        csv_lines = (
            (experiment / fold / "saved_csvs" / f"{ACCURACIES.format('VAL')}.csv").read_text().splitlines()
        )
        assert len([line for line in csv_lines if not line.startswith("~iteration~")]) == 4
        for name in ("trunk", "embedder", "metric_loss", "metric_loss_optimizer"):
            assert (experiment / fold / "saved_models" / f"{name}_2.pth").is_file()


def test_records_hold_map_at_r_for_every_fold(experiment):
    experiment, _, _ = experiment
    for fold in FOLDS:
        fold_table = fold_rows(experiment, fold)
        assert all(0 <= row[MAP_R] <= 1 for row in fold_table)  # 12 val classes: 0 is possible untrained
        # pb's selection: the best epoch >= 0, the earliest of equals; a trained one in every fold
        best_epoch = max((r for r in fold_table if r["epoch"] >= 0), key=lambda r: (r[MAP_R], -r["epoch"]))[
            "epoch"
        ]
        assert best_epoch > 0, fold
        # the learnable mean fields were trained and recorded
        assert rows(experiment / fold / "saved_csvs" / "logs.db", "loss_histories")
    meta = experiment / "meta_logs" / "saved_csvs" / "logs.db"
    for split in ("VAL", "TEST"):
        table = rows(meta, f"MeanAggregator_{ACCURACIES.format(split)}")
        assert [r["trained_status"] for r in table] == [
            "untrained_trunk",
            "untrained_trunk_and_embedder",
            "trained",
        ]
        for row in table:
            # 0 is possible on the tiny validation and test sets (12 and 48 classes, 2 images each)
            assert 0 <= row[MAP_R] <= 1 and row[f"SEM_{MAP_R}"] >= 0 and row["timestamp"]
    best_val = rows(meta, f"MeanAggregator_{ACCURACIES.format('VAL')}")[-1][MAP_R]
    best_per_fold = [max(r[MAP_R] for r in fold_rows(experiment, fold) if r["epoch"] > 0) for fold in FOLDS]
    assert best_val == pytest.approx(sum(best_per_fold) / 4)


def test_ensemble_result_exists(experiment):
    experiment, _, logs = experiment
    table = rows(
        experiment / "meta_logs" / "saved_csvs" / "logs.db",
        f"ConcatenateEmbeddings_{ACCURACIES.format('TEST')}",
    )
    assert [r["trained_status"] for r in table] == [
        "untrained_trunk",
        "untrained_trunk_and_embedder",
        "trained",
    ]
    assert [r["epoch"] for r in table] == ["untrained_trunk", "untrained_trunk_and_embedder", "trained"]
    assert all(0 <= r[MAP_R] <= 1 for r in table)
    assert "embedding dimensionality is 512" in logs["ensemble"]  # 4 folds x 128


def test_bayesian_optimisation_resumes_and_reports(tmp_path):
    """Step 0 in one run; step 1 killed during training and resumed in the next; then the
    best step's test evaluation, one reproduction and the reports."""
    args = [
        "--experiment_name", "bo", *RESUMED,
        "--split_manager~APPLY~2", "{num_training_sets:", "2}",
        "--config_loss_and_miners", "[mean_field_contrastive_bayes_opt]",
        "--config_optimizers", "[default,", "emoji_features,", "with_metric_loss_optimizer_bayes_opt]",
        "--reproductions", "1",
    ]  # fmt: skip
    run_launcher(tmp_path, "--bayes_opt_iters", "1", *args, log_name="bo1.log")
    root = tmp_path / "bo"
    first_trial = file_states(root / "bo0" / FOLDS[0] / "saved_models")
    # a second step, killed while it trains, then resumed
    started_db = root / "bo1" / FOLDS[0] / "saved_csvs" / "logs.db"
    run_and_kill(tmp_path, "--bayes_opt_iters", "2", *args, log_name="bo2_killed.log", started_db=started_db)
    output = run_launcher(tmp_path, "--bayes_opt_iters", "2", *args, log_name="bo2.log")
    assert "Optimization iteration 0" not in output and "Optimization iteration 1" in output
    assert "starting it again" not in output and "starting fresh" not in output  # resumed, not restarted
    # the trials ran on a warm runner in this process, each timed on it, in time-stamped log
    # lines (benchmarks/bench_parallel_sweep.py reads them)
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \S+ INFO: "
    assert re.search(stamp + r"The trial runner was built in [\d.]+ s$", output, re.MULTILINE), output[-5000:]
    assert re.search(
        stamp + r"Optimization iteration 1 finished \([\d.]+ s on its runner\)$", output, re.MULTILINE
    )
    assert file_states(root / "bo0" / FOLDS[0] / "saved_models") == first_trial
    for trial in ("bo0", "bo1"):
        for fold in FOLDS[:2]:
            assert [r["epoch"] for r in fold_rows(root / trial, fold)] == [-1, 0, 1, 2], (trial, fold)

    trials = rows(root / "bayes_opt_record_keeper_logs" / "logs.db", "bayes_opt")
    assert [r["trial_index"] for r in trials] == [0, 1] and all(
        r["trial_status"] == "COMPLETED" for r in trials
    )
    metric = "mean_average_precision_at_r"
    for r in trials:
        check_trial_value(root / f"bo{r['trial_index']}", r, rows)
        assert 0 <= r["loss_funcs_metric_loss_MeanFieldContrastiveLoss_pos_margin"] <= 0.2
        assert 1e-6 <= r["optimizers_metric_loss_optimizer_RMSprop_lr"] <= 1
    best = yaml.safe_load((root / "best_parameters.yaml").read_text())
    best_trial = max(trials, key=lambda r: r[metric])
    assert best["best_sub_experiment_name"] == f"bo{best_trial['trial_index']}"
    assert best["best_values"][metric]["mean"] == pytest.approx(best_trial[metric])
    assert best["best_values"][metric]["SEM"] == pytest.approx(best_trial[f"SEM_{metric}"])
    assert best["best_parameters"][
        "loss_funcs/metric_loss/MeanFieldContrastiveLoss/neg_margin"
    ] == pytest.approx(best_trial["loss_funcs_metric_loss_MeanFieldContrastiveLoss_neg_margin"])
    # ax's state after each new and each completed trial (trial 1 was made once, before the kill)
    assert len(list((root / "bayes_opt_ax_logs").glob("log*.json"))) == 4
    assert "plotly" in (root / "optimization_plots.html").read_text()

    name = best["best_sub_experiment_name"]
    assert (root / f"{name}_reproduction0" / FOLDS[1] / "saved_models").is_dir()
    for kind in ("MeanAggregator", "ConcatenateEmbeddings"):
        base = f"{kind}_accuracies_normalized_GlobalEmbeddingSpaceTester_level_0"
        report = yaml.safe_load((root / f"report_{base}.yaml").read_text())
        trained = report["trained"][MAP_R]
        low, high = trained["95%_confidence_interval"]
        assert low <= trained["mean"] <= high
        details = yaml.safe_load((root / f"detailed_report_{base}.yaml").read_text())
        assert sorted(details) == [name, f"{name}_reproduction0"]
        assert all(0 <= d["trained"][MAP_R] <= 1 for d in details.values())


def test_drml_head_trains_in_pb(tmp_path):
    """On the generated images (a trunk with parameters: the head's input is learnt too)."""
    output = run_launcher(
        tmp_path, "--experiment_name", "drml",
        "--config_dataset", "[default,", "synthetic]",
        "--config_transforms", "[default,", "small]",
        "--config_general", "[default,", "quick]",
        "--config_eval", "[default,", "quick]",
        "--sampler~APPLY~2", "{length_before_new_iter:", "320}",
        "--split_manager~APPLY~2", "{num_training_sets:", "1}",
        "--config_models", "[default,", "tiny,", "drml]",
        "--config_loss_and_miners", "[drml_proxy_anchor]",
        "--config_optimizers", "[default,", "quick,", "drml]",
        log_name="drml.log",
    )  # fmt: skip
    fold = tmp_path / "drml" / FOLDS[0]
    assert [r["epoch"] for r in fold_rows(tmp_path / "drml", FOLDS[0])] == [-1, 0, 1, 2]
    assert "in_features=64, embedding_size=128, num_branches=4" in output
    losses = rows(fold / "saved_csvs" / "logs.db", "loss_histories")
    assert losses and all(r["metric_loss"] > 0 for r in losses)
    assert (fold / "saved_models" / "metric_loss_2.pth").is_file()

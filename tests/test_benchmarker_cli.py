"""No user mistake or fault meets a raw traceback in ``pml-fieldlosses-pb``: each class of
mistake (an option's value, pb's part of the command line, the config root and files, the
configs' classes and keys, the experiment folder's state, the file system, the files a run
reads back, Ray, Ctrl-C) is refused in one line on stderr naming the option or the path,
with exit code 2 (a mistake) or 1 (a fault), before anything trains or is written. A bug
keeps its traceback. The launcher's ``main`` runs in-process; nothing here trains."""

import contextlib
import errno
import io
import math
import os
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .pb_support import pb_skip

MISSING, pytestmark = pb_skip("powerful_benchmarker", "torchvision", "ax")
if not MISSING:
    import torch
    import yaml

    from pml_fieldlosses.app import cluster, extras
    from pml_fieldlosses.app.benchmarker import checks, files, launcher, runners
    from pml_fieldlosses.app.errors import UsageError

CONFIG_ROOT = Path(__file__).resolve().parents[1] / "configs"
# refused in the launcher's parse, after its own options: a valid value of those gets this line
NO_ROOT = ["--root_config_folder", "/no/such/config/root"]
# refused after pb's options were read and the configs loaded and merged: everything before passed
SENTINEL = ["--no_such_key", "1"]
FOLD = "Test50_50_Partitions4_0"
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def run_main(argv):
    """(exit code, stdout, stderr) of ``launcher.main(argv)``; 0 when it returns."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            launcher.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def refused(argv, code, *words):
    """``main(argv)`` exits with ``code`` after exactly one line on stderr, no traceback,
    holding each of ``words``; returns the line."""
    got, _, err = run_main(argv)
    lines = err.strip().splitlines()
    assert got == code and len(lines) == 1 and "Traceback" not in err, (got, err[-3000:])
    assert lines[0].startswith("pml-fieldlosses-pb: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture
def root(tmp_path):
    """An empty experiment root; the runs below are in it."""
    folder = tmp_path / "experiments"
    folder.mkdir()
    return folder


def in_root(root, *args):
    return ["--root_experiment_folder", str(root), *args]


# ------------------------------------------------------------------ --help
@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-h"],
        ["--experiment_name", "x", "--help"],
        ["--bayes_opt_iters", "2", "-h", "--config_x", "[y]"],
    ],
)
def test_help_prints_the_usage_and_exits_0(argv):
    code, out, err = run_main(argv)
    assert code == 0 and out.startswith("usage: pml-fieldlosses-pb") and "--traceback" in out and err == ""


# ------------------------------------------------------------------ the launcher's own options
def valid_reproductions(text):
    try:
        bounds = [int(x) for x in text.split(",")]
    except ValueError:
        return False
    return (len(bounds) == 1 and bounds[0] >= 0) or (len(bounds) == 2 and 0 <= bounds[0] <= bounds[1])


def valid_number(text, low, low_open=False):
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and (value > low if low_open else value >= low)


def valid_int(text, low):
    try:
        return int(text) >= low
    except ValueError:
        return False


VALID = {
    "--bayes_opt_iters": lambda t: valid_int(t, 0),
    "--reproductions": valid_reproductions,
    "--parallel_trials": lambda t: valid_int(t, 1),
    "--trial_gpus": lambda t: valid_number(t, 0),
    "--trial_cpus": lambda t: valid_number(t, 0, low_open=True),
    "--ray_address": lambda t: (
        t in ("auto", "local")
        or bool(cluster.ADDRESS.match(t))
        and 1 <= int(cluster.ADDRESS.match(t)["port"]) <= 65535
    ),
}
VALUES = st.one_of(
    st.integers(-5, 5).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        ["", "abc", "1,3", "3,1", "1,2,3", "-1,2", "auto", "local", "h:6379", "h:0", "ray://h:10001"]
    ),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
)


@FEW
@given(option=st.sampled_from(sorted(VALID)), value=VALUES)
def test_a_bad_value_of_a_launcher_option_is_refused_in_one_line(option, value):
    """Any value: a valid one passes the option's check (the run is then refused for the
    missing config root), any other is refused naming the option, before anything runs."""
    argv = [option, value, "--experiment_name", "x", *NO_ROOT]
    if VALID[option](value) and not an_option(value):
        refused(argv, 2, "argument --root_config_folder")
    else:
        refused(argv, 2, f"argument {option}")


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--parallel_trials", "0"], ["--parallel_trials must be >= 1, got 0"]),
        (["--parallel_trials", "2"], ["--parallel_trials", "only with --bayes_opt_iters"]),
        (["--ray_address", "auto"], ["--ray_address", "only with --bayes_opt_iters"]),
        (["--trial_cpus", "2"], ["--trial_cpus", "only with --bayes_opt_iters"]),
        (["--reproductions", "2"], ["--reproductions", "only with --bayes_opt_iters"]),
        (["--register", "losss=pml_fieldlosses.losses"], ["--register", "unknown kind 'losss'"]),
        (["--register", "loss=no_such_module_here"], ["--register", "No module named"]),
    ],
)
def test_launcher_option_combinations(root, argv, words):
    refused(in_root(root, "--experiment_name", "x", *argv), 2, *words)
    assert not any(root.iterdir())


def test_ray_without_the_cluster_extra_names_the_pip_command(root, monkeypatch):
    real = extras.missing_modules
    monkeypatch.setattr(
        extras, "missing_modules", lambda extra: ["ray"] if extra == "cluster" else real(extra)
    )
    for argv in (["--parallel_trials", "2"], ["--ray_address", "auto"]):
        refused(in_root(root, "--experiment_name", "x", "--bayes_opt_iters", "2", *argv), 2,
                argv[0], 'pip install "pml-fieldlosses[cluster]"')  # fmt: skip


def test_an_unreachable_ray_cluster_is_named_before_anything_is_written(root):
    line = refused(
        in_root(root, "--experiment_name", "x", "--bayes_opt_iters", "1", "--ray_address", "127.0.0.1:1",
                "--config_loss_and_miners", "[potential_field_bayes_opt]"), 1, "127.0.0.1:1", "cannot reach",
    )  # fmt: skip
    assert "ray start --head" in line
    assert not any(root.iterdir())


# ------------------------------------------------------------------ pb's part of the command line
def an_option(word):
    """argparse takes a word that starts with '-' and is no negative number for an option."""
    return word.startswith("-") and re.match(r"^-\d+$|^-\d*\.\d+$", word) is None


def valid_name(name):
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name and not an_option(name)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), max_size=20))
def test_an_experiment_name_is_one_folder_name(root, name):
    if valid_name(name):
        refused(in_root(root, "--experiment_name", name, *SENTINEL), 2, "unknown option --no_such_key")
    else:
        refused(in_root(root, "--experiment_name", name, *SENTINEL), 2, "--experiment_name")
    assert not any(root.iterdir())


@pytest.mark.parametrize(
    "argv,words",
    [
        ([], ["the following arguments are required: --experiment_name"]),
        (["--experiment_name", "x", "--resume_training", "soon"], ["--resume_training", "invalid choice"]),
        (["--experiment_name", "x", "--dataset~APPLY~2", "{download:True}"],
         ["argument --dataset~APPLY~2", "space after each colon"]),
        (["--experiment_name", "x", "--dataset~APPLY~2", "{download:", "True"], ["--dataset~APPLY~2", "unbalanced {"]),
        (["stray", "--experiment_name", "x"], ["'stray' follows no option"]),
        (["--experiment_name", "x", "--patience", "[1,"], ["argument --patience", "unbalanced ["]),
        (["--experiment_name", "x", "--patience", "{a:", "b:", "c}"], ["argument --patience", "is not YAML (line 1"]),
        (["--experiment_name", "x", "--patience", "1", "2"], ["2 is missing"]),
        (["--experiment_name", "x", "--num_epochs_trian", "3"], ["unknown option --num_epochs_trian",
                                                                "did you mean --num_epochs_train?"]),
        (["--experiment_name", "x", "--splits_to_eval", "[nosuch]"], ["splits_to_eval", "nosuch"]),
        (["--experiment_name", "x", "--splits_to_eval", "[]"], ["splits_to_eval"]),
        (["--experiment_name", "x", "--splits_to_eval", "[val,", "val]"], ["splits_to_eval"]),
        (["--experiment_name", "x", "--splits_to_eval", "test"], ["splits_to_eval", "'test'"]),
    ],
)  # fmt: skip
def test_a_mistake_in_pbs_part_is_refused_in_one_line(root, argv, words):
    refused(in_root(root, *argv), 2, *words)
    assert not any(root.iterdir())


@pytest.mark.parametrize(
    "words",
    [
        ["--sampler~APPLY~2 {length_before_new_iter: 1600}"],
        ["--sampler~APPLY~2", "{length_before_new_iter: 1600}"],
        ["--sampler~APPLY~2={length_before_new_iter: 1600}"],
        ["--experiment_name=y", "--config_models=[default, tiny]"],
    ],
)
def test_an_option_quoted_with_its_value_is_read_as_the_shell_would_split_it(root, words):
    assert runners.pb_words(words) == runners.pb_words(" ".join(words).replace("=", " ").split())
    refused(in_root(root, "--experiment_name", "x", *words, *SENTINEL), 2, "unknown option --no_such_key")


@pytest.mark.parametrize(
    "override,where",
    [
        (["--dataset~OVERRIDE~", "{NoSuchSet:", "{}}"], "dataset: no dataset named 'NoSuchSet'"),
        (["--loss_funcs~OVERRIDE~", "{metric_loss:", "{NoLoss:", "{}}}"], "loss_funcs/metric_loss: no loss"),
        (["--models~OVERRIDE~", "{trunk:", "{resnet5:", "{}},", "embedder:", "{MLP:", "{}}}"],
         "models/trunk: no model named 'resnet5'"),
        (["--optimizers~OVERRIDE~", "{embedder_optimizer:", "{Adamm:", "{lr:", "0.1}}}"],
         "optimizers/embedder_optimizer: no optimizer named 'Adamm'"),
        (["--optimizers~OVERRIDE~", "{embedder_optimizer:", "{Adam:", "{},", "scheduler_by_epoch:", "{StepLRR:",
          "{}}}}"], "optimizers/embedder_optimizer/scheduler_by_epoch: no lr_scheduler named 'StepLRR'"),
        (["--sampler~OVERRIDE~", "{MPerClass:", "{}}"], "sampler: no sampler named 'MPerClass'"),
        (["--transforms~OVERRIDE~", "{train:", "{Resize:", "{size:", "32}},", "eval:", "{Resise:", "{size:", "32}}}"],
         "transforms/eval: no transform named 'Resise'"),
        (["--loss_funcs~OVERRIDE~", "{metric_loss:", "{ContrastiveLoss:", "{distance:", "{Cosine:", "{}}}}}"],
         "loss_funcs/metric_loss/ContrastiveLoss/distance: no distance named 'Cosine'"),
        (["--dataset~OVERRIDE~", "{A:", "{},", "B:", "{}}"], "dataset: expected one dataset"),
        (["--dataset~OVERRIDE~", "{SyntheticImages:", "{num_clases:", "8}}"],
         "dataset/SyntheticImages: no parameter 'num_clases' (did you mean 'num_classes'?)"),
        (["--sampler~APPLY~2", "{mm:", "4}"], "sampler/MPerClassSampler: no parameter 'mm'"),
        (["--models~OVERRIDE~", "{trunk:", "{bninception:", "{}},", "embedder:", "{MLP:", "{layer_size:", "[64]}}}"],
         "models/embedder/MLP: no parameter 'layer_size'"),
    ],
)  # fmt: skip
def test_a_class_name_no_module_has_is_named(root, override, where):
    line = refused(in_root(root, "--experiment_name", "x", *override), 2, where)
    assert "--register" in line or "expected one" in line or "parameter" in line
    assert not any(root.iterdir())


def test_every_shipped_config_passes_the_checks(root):
    """No false refusal: each config file after default reaches the last check."""
    for folder in sorted(p for p in CONFIG_ROOT.iterdir() if p.is_dir()):
        for name in sorted(p.stem for p in folder.glob("*.yaml") if p.stem != "default"):
            argv = in_root(
                root, "--experiment_name", "x", f"--{folder.name}", "[default,", f"{name}]", *SENTINEL
            )
            refused(argv, 2, "unknown option --no_such_key")


# ------------------------------------------------------------------ the config root and files
@pytest.fixture
def config_copy(tmp_path):
    copy = tmp_path / "configs"
    shutil.copytree(CONFIG_ROOT, copy)
    return copy


@pytest.mark.parametrize(
    "content,words",
    [
        ("dataset: {CUB200: [}\n", ["line 1", "bad.yaml"]),
        ("- a\n- b\n", ["bad.yaml", "holds a list"]),
        ("", ["bad.yaml", "holds nothing"]),
        ("a: 1\n\tb: 2\n", ["bad.yaml", "not valid YAML"]),
    ],
)
def test_a_malformed_config_file_is_named(root, config_copy, content, words):
    (config_copy / "config_dataset" / "bad.yaml").write_text(content)
    argv = in_root(root, "--root_config_folder", str(config_copy), "--experiment_name", "x",
                   "--config_dataset", "[default,", "bad]")  # fmt: skip
    refused(argv, 2, str(config_copy / "config_dataset" / "bad.yaml"), *words)


def test_the_config_root_is_checked(root, config_copy, tmp_path):
    refused(in_root(root, "--root_config_folder", str(tmp_path / "none"), "--experiment_name", "x"), 2,
            "--root_config_folder", str(tmp_path / "none"))  # fmt: skip
    (tmp_path / "empty").mkdir()
    refused(in_root(root, "--root_config_folder", str(tmp_path / "empty"), "--experiment_name", "x"), 2,
            str(tmp_path / "empty" / "config_foldernames.yaml"), "does not exist")  # fmt: skip
    (config_copy / "config_foldernames.yaml").write_text("config_foldernames: [config_dataset\n")
    refused(in_root(root, "--root_config_folder", str(config_copy), "--experiment_name", "x"), 2,
            "config_foldernames.yaml", "not valid YAML")  # fmt: skip
    refused(in_root(root, "--experiment_name", "x", "--config_models", "[tinny]"), 2,
            "no config named 'tinny'", str(CONFIG_ROOT / "config_models"), "available: ")  # fmt: skip


def test_a_default_config_that_is_missing_is_named(root, config_copy):
    (config_copy / "config_eval" / "default.yaml").unlink()
    refused(in_root(root, "--root_config_folder", str(config_copy), "--experiment_name", "x"), 2,
            str(config_copy / "config_eval" / "default.yaml"), "does not exist")  # fmt: skip


# ------------------------------------------------------------------ the experiment folder
def saved_experiment(root, name="x", *args):
    """An experiment folder as pb leaves it after its start: its configs saved (from the
    config root, as pb merges them)."""
    _, factory = launcher.parse(in_root(root, "--experiment_name", name, *args))
    runner = factory.single_experiment_runner()
    YR = runner.setup_yaml_reader()
    _, _, dict_of_yamls = YR.load_yamls(
        runner.get_root_config_paths(YR.args), float("inf"), float("inf"), True
    )
    files.write_configs(str(root / name / "configs"), dict_of_yamls)
    return root / name


def checkpoints(experiment, suffix, names=("trunk", "embedder")):
    models = experiment / FOLD / "saved_models"
    models.mkdir(parents=True, exist_ok=True)
    for name in names:
        torch.save({"w": torch.zeros(2)}, models / f"{name}_{suffix}.pth")
    return models


@pytest.mark.parametrize("flag", [["--evaluate"], ["--evaluate_ensemble"], ["--resume_training", "latest"]])
def test_continuing_an_experiment_that_never_ran_is_refused(root, flag):
    refused(
        in_root(root, "--experiment_name", "x", *flag), 2, flag[0], "has not run", str(root / "x" / "configs")
    )
    assert not any(root.iterdir())


def test_evaluating_an_experiment_without_a_trained_model_is_refused(root):
    saved_experiment(root)
    refused(in_root(root, "--experiment_name", "x", "--evaluate"), 2, "--evaluate", "no trained model yet")


def test_a_new_experiment_in_a_taken_folder_is_refused(root):
    (root / "x" / "sub").mkdir(parents=True)
    (root / "x" / "sub" / "file").write_text("")
    refused(in_root(root, "--experiment_name", "x"), 2, "the experiment folder is already taken")


def test_reproducing_a_folder_that_is_no_experiment_is_refused(root, tmp_path):
    refused(in_root(root, "--experiment_name", "x", "--reproduce_results", str(tmp_path)), 2,
            "--reproduce_results", "not an experiment folder")  # fmt: skip


@pytest.mark.parametrize("option", ["--root_experiment_folder", "--dataset_root", "--pytorch_home"])
def test_a_file_where_a_folder_is_expected_is_named(root, tmp_path, option):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    argv = ["--root_experiment_folder", str(root), option, str(a_file), "--experiment_name", "x"]
    refused(argv, 1, option, str(a_file), "not a folder")


def test_a_folder_where_the_database_file_is_expected_is_named(root):
    refused(
        in_root(root, "--experiment_name", "x", "--global_db_path", str(root)),
        1,
        "--global_db_path",
        str(root),
    )


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_an_experiment_root_that_cannot_be_written_is_named(root, monkeypatch, code):
    def refuse(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    line = refused(in_root(root, "--experiment_name", "x"), 1, "--root_experiment_folder", str(root))
    assert {errno.ENOSPC: "disk is full", errno.EROFS: "read-only", errno.EACCES: "permission"}[code] in line


# ------------------------------------------------------------------ files read back
def test_a_corrupt_saved_config_is_named(root):
    experiment = saved_experiment(root)
    path = experiment / "configs" / "config_general.yaml"
    path.write_text(path.read_text()[:25] + "\n  - [")
    refused(in_root(root, "--experiment_name", "x", "--evaluate"), 1, str(path), "saved config")


def test_a_truncated_checkpoint_is_named(root):
    experiment = saved_experiment(root)
    models = checkpoints(experiment, "best2")
    (models / "trunk_best2.pth").write_bytes((models / "trunk_best2.pth").read_bytes()[:40])
    refused(
        in_root(root, "--experiment_name", "x", "--evaluate"),
        1,
        str(models / "trunk_best2.pth"),
        "*_best2.pth",
    )
    checkpoints(experiment, "2", names=("trunk", "embedder", "trunk_optimizer"))
    (models / "trunk_optimizer_2.pth").write_bytes(b"")
    refused(
        in_root(root, "--experiment_name", "x", "--resume_training", "latest"), 1, "trunk_optimizer_2.pth"
    )


def test_a_corrupt_record_database_is_named(root):
    experiment = saved_experiment(root)
    checkpoints(experiment, "best2")
    db = experiment / FOLD / "saved_csvs" / "logs.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not a database" * 100)
    refused(in_root(root, "--experiment_name", "x", "--evaluate"), 1, str(db), "record database")


def test_unreadable_ax_logs_are_named_not_replaced(root):
    args = ["--config_loss_and_miners", "[potential_field_bayes_opt]", "--bayes_opt_iters", "1"]
    experiment = saved_experiment(root, "bo", *args)
    logs = experiment / "bayes_opt_ax_logs"
    logs.mkdir()
    (logs / "log00000.json").write_text('{"experiment": ')
    refused(in_root(root, "--experiment_name", "bo", *args), 1, str(logs), "none of the 1 ax logs")
    assert sorted(p.name for p in logs.iterdir()) == ["log00000.json"]


def test_a_resumed_optimisation_without_search_ranges_names_its_folder(root):
    saved_experiment(root, "bo")
    refused(in_root(root, "--experiment_name", "bo", "--bayes_opt_iters", "1"), 2,
            "--bayes_opt_iters", str(root / "bo" / "configs"), "no search range")  # fmt: skip


@pytest.mark.parametrize(
    "value,words",
    [("[0.3, 0.1]", ["low < high"]), ("[0, 1]", ["low > 0"]), ("[a, 1]", ["[low, high]"]), ("0.5", ["0.5"])],
)
def test_a_malformed_search_range_is_named(root, config_copy, value, words):
    (config_copy / "config_loss_and_miners" / "bad.yaml").write_text(
        f"loss_funcs~OVERRIDE~:\n  metric_loss:\n    ContrastiveLoss:\n      pos_margin~LOG_BAYESIAN~: {value}\n"
    )
    argv = in_root(root, "--root_config_folder", str(config_copy), "--experiment_name", "x",
                   "--bayes_opt_iters", "1", "--config_loss_and_miners", "[default,", "bad]")  # fmt: skip
    refused(argv, 2, "loss_funcs/metric_loss/ContrastiveLoss/pos_margin~LOG_BAYESIAN~", *words)


def test_no_search_range_is_refused_before_anything_is_written(root):
    refused(
        in_root(root, "--experiment_name", "x", "--bayes_opt_iters", "2"),
        2,
        "needs at least one search range",
    )
    assert not any(root.iterdir())


# ------------------------------------------------------------------ during the run
def test_pbs_refusal_of_a_taken_folder_is_one_line(root, monkeypatch):
    class Refuses:
        def run(self):
            raise SystemExit()

    monkeypatch.setattr(launcher, "make_runner", lambda args, factory: Refuses())
    refused(in_root(root, "--experiment_name", "x"), 2, "the experiment folder is already taken")


@pytest.mark.parametrize(
    "error,code,words",
    [
        (KeyboardInterrupt(), 130, ["interrupted", "run the same command again"]),
        (
            OSError(errno.ENOSPC, "No space left on device", "/exp/x/f.pth"),
            1,
            ["/exp/x/f.pth", "disk is full"],
        ),
        (OSError(errno.EROFS, "Read-only file system", "/exp/x"), 1, ["/exp/x", "read-only"]),
        (OSError(errno.ENOSPC, "No space left on device"), 1, ["--root_experiment_folder", "disk is full"]),
        (sqlite3.OperationalError("database or disk is full"), 1, ["records under --root_experiment_folder"]),
        (sqlite3.OperationalError("attempt to write a readonly database"), 1, ["records under", "readonly"]),
    ],
)
def test_what_stops_a_run_is_one_line(root, monkeypatch, error, code, words):
    class Stops:
        def run(self):
            raise error

    monkeypatch.setattr(launcher, "make_runner", lambda args, factory: Stops())
    refused(in_root(root, "--experiment_name", "x"), code, *words)


def test_a_trials_user_error_from_its_ray_worker_is_one_line(root, monkeypatch):
    class Fails:
        def run(self):
            try:
                raise UsageError("dataset: no dataset named 'X'")
            except UsageError as cause:
                raise cluster.JobFailed("job 0 failed: UsageError(...)") from cause

    monkeypatch.setattr(launcher, "make_runner", lambda args, factory: Fails())
    refused(in_root(root, "--experiment_name", "x"), 2, "no dataset named 'X'", "on a Ray worker")


def test_a_bug_keeps_its_traceback_and_traceback_shows_a_mistakes(root, monkeypatch):
    class Bug:
        def run(self):
            raise KeyError("a bug of ours")

    monkeypatch.setattr(launcher, "make_runner", lambda args, factory: Bug())
    with pytest.raises(KeyError, match="a bug of ours"):
        launcher.main(in_root(root, "--experiment_name", "x"))
    with pytest.raises(UsageError, match="--bayes_opt_iters needs"):
        launcher.main(in_root(root, "--experiment_name", "y", "--bayes_opt_iters", "1", "--traceback"))


def test_the_checks_do_not_read_sys_argv(root, monkeypatch):
    monkeypatch.setattr("sys.argv", ["pml-fieldlosses-pb", "--evaluate"])
    refused(in_root(root, "--experiment_name", "x", *SENTINEL), 2, "unknown option --no_such_key")


def test_read_yaml_names_the_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("a: [1, 2")
    with pytest.raises(files.FileFault, match=r"p\.yaml is not valid YAML \(line \d+, column \d+"):
        files.read_yaml(path, "trial parameters file")
    files.write_yaml(path, {"a": [1, 2]})
    assert yaml.safe_load(path.read_text()) == {"a": [1, 2]} and files.read_yaml(path) == {"a": [1, 2]}
    assert checks.check_splits(["val", "test"]) is None

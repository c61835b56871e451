"""The files the runner writes and reads back: YAML files (configs, parameters, reports),
checkpoints and record databases.

Each is written whole or not at all (a temporary file that takes the name at the end,
errors.atomic_write), and checked when it is read back: a file that is not what it
should be (truncated, not YAML, not a database) is a FileFault naming it and what to do,
never a traceback nor a silently partial value.
"""

import glob
import os
import shutil
import sqlite3
import zipfile
from pathlib import Path

import yaml
from pytorch_metric_learning.utils import common_functions as pml_c_f

from ..errors import FileFault, atomic_write, file_fault

SAVED_CONFIG_ADVICE = (
    "restore it, or move the experiment folder away and start again (a run saves its configs "
    "when it starts and reads them back when it resumes)"
)


def describe_yaml_error(error):
    """'line L, column C: problem' of a YAML error (its first line otherwise)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def read_yaml(path, what="YAML file", advice="fix or restore it", error=FileFault):
    """The content of YAML file ``path``, a mapping; otherwise an
    ``error`` (FileFault; UsageError for a file the user wrote) naming it (``what``, e.g.
    "config file") and ``advice``."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist: {advice}") from None
    except OSError as e:
        raise file_fault(e, path, f"reading the {what}") from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        reason = describe_yaml_error(e) if isinstance(e, yaml.YAMLError) else "not UTF-8 text"
        raise error(f"{what} {path} is not valid YAML ({reason}): {advice}") from None
    if not isinstance(data, dict):
        held = "nothing" if data is None else f"a {type(data).__name__}"
        raise error(f"{what} {path} holds {held}, not a mapping of keys: {advice}")
    return data


def write_yaml(path, data):
    """pb's ``write_yaml`` (block style, keys in order), written whole."""
    with atomic_write(path, doing="writing") as f:
        yaml.dump(data, f, default_flow_style=False, sort_keys=False)


def write_text(path, text):
    """A UTF-8 text file, written whole."""
    with atomic_write(path, mode="wb", doing="writing") as f:
        f.write(text.encode("utf-8"))


def check_database(path):
    """A record database (SQLite) that exists is readable; a FileFault naming it otherwise
    (one that another process holds locked is taken as readable). It is opened for writing
    where the file allows it (never created): a transaction that a killed process left open
    (a hot journal beside the file) is then rolled back, as SQLite does on any access that
    may write, where a read-only connection would fail ("attempt to write a readonly
    database") on a database that is whole."""
    if not os.path.exists(path):
        return
    try:
        connection = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=rw", uri=True, timeout=60)
        try:
            status = connection.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            connection.close()
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            return
        status = str(e)
    except sqlite3.Error as e:
        status = str(e)
    if status != "ok":
        raise FileFault(
            f"record database {path} cannot be read ({status}): restore it, or move the experiment "
            "away and run it again"
        )


def check_checkpoint(path):
    """A checkpoint file (torch's zip format) is whole: a truncated or otherwise unreadable
    one is a FileFault naming it and the files of its epoch."""
    try:
        with zipfile.ZipFile(path):
            return
    except FileNotFoundError:
        problem = "missing"
    except (zipfile.BadZipFile, OSError) as e:
        problem = f"unreadable: {e}"
    epoch = os.path.basename(path).rsplit("_", 1)[-1]
    raise FileFault(
        f"checkpoint {path} is {problem}: delete the files of that epoch "
        f"({os.path.join(os.path.dirname(path), '*_' + epoch)}) to go on from the checkpoint before"
    )


def check_checkpoints(model_folder, suffix, names=("trunk", "embedder")):
    """The checkpoints ``<name>_<suffix>.pth`` of ``names`` in ``model_folder``, and every
    other file of that epoch, are whole (check_checkpoint)."""
    paths = {os.path.join(model_folder, f"{name}_{suffix}.pth") for name in names}
    paths.update(glob.glob(os.path.join(model_folder, f"*_{suffix}.pth")))
    for path in sorted(paths):
        check_checkpoint(path)


def write_configs(folder, dict_of_yamls):
    """pb's saved configs of a new experiment (``<name>.yaml`` per config), all or none:
    written into a temporary folder beside ``folder`` that then takes its name (a run
    that finds ``folder`` resumes from it)."""
    tmp = f"{folder}.tmp"
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while writing
        os.makedirs(tmp)
        for name, config in dict_of_yamls.items():
            write_yaml(os.path.join(tmp, f"{name}.yaml"), config)
        os.replace(tmp, folder)
    except OSError as e:
        raise file_fault(e, folder, "saving the configs in") from e


def experiment_checkpoints(folder, best):
    """[(model folder, suffix)] of the checkpoints pb loads in each fold of experiment
    ``folder``: the best (``best``) or the latest epoch's; none for a fold without any."""
    found = []
    for model_folder in sorted(glob.glob(os.path.join(folder, "*", "saved_models"))):
        try:
            epoch, suffix = pml_c_f.latest_version(model_folder, "trunk_*.pth", best=best)
        except ValueError:  # trunk files, none of them a best one
            continue
        if epoch > 0:
            found.append((model_folder, suffix))
    return found


def check_experiment_checkpoints(folder, best):
    """The checkpoints pb loads in each fold of experiment ``folder`` are whole."""
    for model_folder, suffix in experiment_checkpoints(folder, best):
        check_checkpoints(model_folder, suffix)

"""What one run leaves behind: a RunResult (every row, the untrained one too),
written atomically to its folder's result.json and validated when read back;
the run folders' names; and the other JSON files of a results folder, read the same way.

Every file is written whole or not at all (errors.atomic_write: a temporary file, then
os.replace), so a killed invocation or a full disk never leaves half a file that a rerun
would take as valid; every file read back is checked (its keys, the type and range of
every value) and a bad one is named with what is wrong (BenchFileError)."""

import dataclasses
import errno
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .. import catalog
from ..errors import DAMAGED_ARRAY_FILE, FileFault, atomic_write
from .metrics import METRICS

UNTRAINED = "(no training)"
UNTRAINED_FOLDER = "no_training"
ORIGINS = ("PML", "ours", "baseline")
# a metric may exceed 1 by float rounding
METRIC_TOLERANCE = 1e-6
# a file system with less free space than this is full (file_system_fault)
FULL_BYTES = 1 << 20


class BenchFileError(FileFault):
    """A file the bench reads back is unreadable or not what it wrote (named, with what is wrong)."""


@dataclass
class RunResult:
    loss: str
    origin: str  # "PML", "ours" or "baseline"
    seed: int
    test: Optional[dict]  # {metric: value}, None when the run was not tested (selection)
    best_epoch: int
    best_val_map_at_r: float
    epochs_run: int = 0
    epoch_seconds: list = field(default_factory=list)
    seconds_per_epoch: float = math.nan
    epoch_losses: list = field(default_factory=list)
    val_history: dict = field(default_factory=lambda: {"epoch": [], "map_at_r": []})
    label_noise: dict = field(default_factory=lambda: {"fraction": 0.0, "changed": 0, "of": 0})
    clipped_fraction: dict = field(default_factory=dict)
    run_seconds: float = 0.0
    # mean distance from each proxy of the selected model to the nearest clean training
    # embedding of its class (both L2-normalised); None for a loss without proxies or an
    # untested run (run.proxy_distance)
    proxy_distance: Optional[float] = None

    # fields added after results were first written: a result.json without them is read
    # with their default
    LATER_FIELDS = ("proxy_distance",)

    def __post_init__(self):
        if self.test is not None and set(self.test) != set(METRICS):
            raise ValueError(f"test metrics must be {sorted(METRICS)}, got {sorted(self.test)}")
        if len(self.val_history.get("epoch", ())) != len(self.val_history.get("map_at_r", ())):
            raise ValueError("val_history needs one MAP@R per epoch")

    def __getitem__(self, key):  # result["loss"], as the summaries read it
        return getattr(self, key)

    def as_dict(self):
        return dataclasses.asdict(self)

    def write(self, path):
        write_json(path, self.as_dict())

    @classmethod
    def read(cls, path):
        """The result in ``path``; BenchFileError naming the file and what is wrong if it is not one."""
        data = read_json(path)
        names = {f.name for f in dataclasses.fields(cls)}
        if isinstance(data, dict):
            later = {f.name: f.default for f in dataclasses.fields(cls) if f.name in cls.LATER_FIELDS}
            data = {**later, **data}
        if not isinstance(data, dict) or set(data) != names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise BenchFileError(f"{path} is not a run result (expected keys {sorted(names)}, got {got})")
        problem = result_problem(data)
        if problem:
            raise BenchFileError(f"{path} is not a run result: {problem}")
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise BenchFileError(f"{path} is not a run result: {e}") from None


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _seconds(value):
    """A duration: finite and not negative."""
    return _number(value) and math.isfinite(value) and value >= 0


def _nan(value):
    return _number(value) and math.isnan(value)


def _fraction(value, nan=True):
    """A value in [0, 1] (a metric, a share), or NaN when ``nan``."""
    if not _number(value):
        return False
    if math.isnan(value):
        return nan
    return -METRIC_TOLERANCE <= value <= 1 + METRIC_TOLERANCE


def result_problem(data):
    """What is wrong with ``data`` (a result.json's dict with every key), or None. NaN is
    accepted where a run can produce it (a metric of a degenerate split, the loss of a
    diverged run), never for a duration or a count."""
    test, history, noise = data["test"], data["val_history"], data["label_noise"]
    checks = [
        ("loss", isinstance(data["loss"], str) and data["loss"] != ""),
        ("origin", data["origin"] in ORIGINS),
        ("seed", _integer(data["seed"])),
        ("test", test is None or (isinstance(test, dict) and all(_fraction(v) for v in test.values()))),
        ("best_epoch", _integer(data["best_epoch"])),
        ("best_val_map_at_r", _fraction(data["best_val_map_at_r"])),
        ("epochs_run", _integer(data["epochs_run"])),
        (
            "epoch_seconds",
            isinstance(data["epoch_seconds"], list) and all(map(_seconds, data["epoch_seconds"])),
        ),
        ("seconds_per_epoch", _seconds(data["seconds_per_epoch"]) or _nan(data["seconds_per_epoch"])),
        ("epoch_losses", isinstance(data["epoch_losses"], list) and all(map(_number, data["epoch_losses"]))),
        (
            "val_history",
            isinstance(history, dict)
            and set(history) == {"epoch", "map_at_r"}
            and isinstance(history["epoch"], list)
            and isinstance(history["map_at_r"], list)
            and all(map(_integer, history["epoch"]))
            and all(map(_fraction, history["map_at_r"])),
        ),
        (
            "label_noise",
            isinstance(noise, dict)
            and set(noise) == {"fraction", "changed", "of"}
            and _number(noise["fraction"])
            and 0 <= noise["fraction"] < 1
            and _integer(noise["changed"])
            and _integer(noise["of"])
            and noise["changed"] <= noise["of"],
        ),
        (
            "clipped_fraction",
            isinstance(data["clipped_fraction"], dict)
            and all(_fraction(v, nan=False) for v in data["clipped_fraction"].values()),
        ),
        ("run_seconds", _seconds(data["run_seconds"])),
        ("proxy_distance", data["proxy_distance"] is None or _seconds(data["proxy_distance"])),
    ]
    bad = [name for name, good in checks if not good]
    if not bad:
        return None
    return "bad " + ", ".join(f"{name} ({data[name]!r:.60})" for name in bad)


def read_embeddings(path, rows, labels=None, finite=True):
    """(float32 embeddings, labels) saved in ``path`` for ``rows`` test images (whose
    labels are ``labels`` when given), None if there is no such file; BenchFileError
    naming a bad one and what is wrong (unreadable, wrong shape, other labels, and with
    ``finite`` values that are not finite: a diverged model's, which no figure can show)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            embeddings, saved_labels = saved["embeddings"].astype(np.float32), saved["labels"]
    except DAMAGED_ARRAY_FILE as e:
        raise BenchFileError(f"{path} is not a saved embedding file ({e!r})") from None
    if embeddings.ndim != 2 or embeddings.shape[0] != rows or saved_labels.shape != (rows,):
        raise BenchFileError(
            f"{path} holds embeddings {embeddings.shape} and labels {saved_labels.shape}, "
            f"expected {rows} rows"
        )
    if labels is not None and not np.array_equal(saved_labels, labels):
        raise BenchFileError(f"{path} holds the labels of other test images than this split's")
    if finite and not np.isfinite(embeddings).all():
        bad = int((~np.isfinite(embeddings).all(axis=1)).sum())
        raise BenchFileError(f"{path} holds {bad} of {rows} test embeddings with NaN or inf values")
    return embeddings, saved_labels


def write_json(path, value, doing="writing"):
    """Write ``value`` as JSON to ``path`` atomically (errors.atomic_write); a FileFault
    names ``path`` when the file system refuses."""
    text = json.dumps(value, indent=1)
    with atomic_write(path, doing=doing) as f:
        f.write(text)


def read_json(path):
    """JSON of ``path``; BenchFileError naming the file if it is empty or not JSON."""
    try:
        text = Path(path).read_text()
        return json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BenchFileError(f"{path} is unreadable or not JSON ({e})") from None


def canonical_name(name):
    """One spelling of each loss setting: a catalog name as it is; a name with settings
    (``NAME[key=value,...]``) with its keys sorted and each value written exactly (an
    integer as one, a float by its shortest exact form): PFML[delta=.5] and PFML[delta=0.5]
    are both PFML[delta=0.5], PFML[delta=5] is another. ValueError for an unknown name."""
    if name == UNTRAINED:
        return name
    entry = catalog.get_entry(name)
    if "[" not in name:
        return name
    written = {item.partition("=")[0].strip() for item in name.partition("[")[2][:-1].split(",")}
    settings = dict(entry.options)
    if entry.tuned in written:
        settings[entry.tuned] = entry.value
    return f"{entry.base_name}[" + ",".join(f"{k}={v!r}" for k, v in sorted(settings.items())) + "]"


def run_name(name):
    """The folder name of the runs of loss ``name``: ``no_training`` for the untrained row,
    the catalog name itself (letters, digits and ``-``), and ``NAME_key=value,...`` for a
    name with settings (its canonical name, without the brackets, which file globs read as
    a pattern). Two different settings never share a folder: catalog names hold no ``_``,
    ``=`` or ``,``, so the name reads back; the same setting written two ways shares one."""
    canonical = canonical_name(name)
    if canonical == UNTRAINED:
        return UNTRAINED_FOLDER
    base, _, settings = canonical.partition("[")
    return f"{base}_{settings[:-1]}" if settings else base


def run_folder(out_dir, name, seed):
    return Path(out_dir) / "runs" / run_name(name) / f"seed{seed}"


def legacy_run_folder(out_dir, name, seed):
    """Where earlier versions put the run (every character but letters, digits, ``-`` and
    ``_`` written as ``_``, which could give two settings one folder): read only to move a
    finished run of the same setting to ``run_folder``."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name).strip("_") or "run"
    return Path(out_dir) / "runs" / safe / f"seed{seed}"


def file_system_fault(folder):
    """errno.EROFS when ``folder``'s file system is read-only, errno.ENOSPC when it has
    less than FULL_BYTES free, else None: what a library's failed write may mean when it
    says it in its own words (torch.save's RuntimeError, sqlite's "database or disk is full")
    or only logs it (PML's model saving)."""
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):  # gone, or no statvfs (Windows)
        return None
    if stats.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stats.f_bavail * stats.f_frsize < FULL_BYTES:
        return errno.ENOSPC
    return None


def earlier_wall_times(out_dir):
    """The wall seconds of the earlier invocations on ``out_dir`` (its wall_time.json);
    BenchFileError naming the file if it is not a list of durations."""
    path = Path(out_dir) / "wall_time.json"
    if not path.exists():
        return []
    data = read_json(path)
    invocations = data.get("invocations") if isinstance(data, dict) else None
    problem = None
    if not isinstance(invocations, list):
        problem = "it has no list of invocation seconds"
    elif not all(_seconds(s) for s in invocations):
        bad = next(s for s in invocations if not _seconds(s))
        problem = f"an invocation lasted {bad!r:.40} seconds (expected a finite number >= 0)"
    elif not _seconds(data.get("total_seconds")) or not math.isclose(
        data["total_seconds"], sum(invocations), rel_tol=1e-9, abs_tol=1e-6
    ):
        problem = f"its total_seconds {data.get('total_seconds')!r:.40} is not the sum of its invocations"
    if problem:
        raise BenchFileError(f"{path} is bad: {problem}; delete it (rm '{path}') to start the sum afresh")
    return invocations


def add_wall_time(out_dir, seconds):
    """Add this invocation's ``seconds`` to the folder's wall_time.json; returns
    (total seconds, invocations)."""
    invocations = [*earlier_wall_times(out_dir), float(seconds)]
    write_json(
        Path(out_dir) / "wall_time.json", {"invocations": invocations, "total_seconds": sum(invocations)}
    )
    return sum(invocations), len(invocations)

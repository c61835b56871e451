"""What one run leaves behind: a RunResult (every row, the untrained one too),
written atomically to its folder's result.json and validated when read back;
and the other JSON files of a results folder, read the same way."""

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .metrics import METRICS

UNTRAINED = "(no training)"


class BenchFileError(RuntimeError):
    """A file the bench reads back is unreadable or not what it wrote."""


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
        """The result in ``path``; BenchFileError naming the file if it is not one."""
        data = read_json(path)
        names = {f.name for f in dataclasses.fields(cls)}
        if isinstance(data, dict):
            later = {f.name: f.default for f in dataclasses.fields(cls) if f.name in cls.LATER_FIELDS}
            data = {**later, **data}
        if not isinstance(data, dict) or set(data) != names:
            got = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise BenchFileError(f"{path} is not a run result (expected keys {sorted(names)}, got {got})")
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise BenchFileError(f"{path} is not a run result: {e}") from None


def write_json(path, value):
    """Write ``value`` as JSON to ``path`` atomically (a temporary file, then os.replace)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def read_json(path):
    """JSON of ``path``; BenchFileError naming the file if it is empty or not JSON."""
    try:
        text = Path(path).read_text()
        return json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BenchFileError(f"{path} is unreadable or not JSON ({e})") from None


def safe_name(name):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name).strip("_") or "run"


def run_folder(out_dir, name, seed):
    return Path(out_dir) / "runs" / safe_name(name) / f"seed{seed}"


def earlier_wall_times(out_dir):
    """The wall seconds of the earlier invocations on ``out_dir`` (its wall_time.json)."""
    path = Path(out_dir) / "wall_time.json"
    if not path.exists():
        return []
    data = read_json(path)
    invocations = data.get("invocations") if isinstance(data, dict) else None
    if not isinstance(invocations, list) or not all(isinstance(s, (int, float)) for s in invocations):
        raise BenchFileError(
            f"{path} is not a list of invocation seconds; delete it (rm '{path}') to start the sum afresh"
        )
    return invocations


def add_wall_time(out_dir, seconds):
    """Add this invocation's ``seconds`` to the folder's wall_time.json; returns
    (total seconds, invocations)."""
    invocations = [*earlier_wall_times(out_dir), float(seconds)]
    write_json(
        Path(out_dir) / "wall_time.json", {"invocations": invocations, "total_seconds": sum(invocations)}
    )
    return sum(invocations), len(invocations)

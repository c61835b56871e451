"""``pml-fieldlosses bench``: every loss on the same footing, on real data, with a report.

from pml_fieldlosses.app.bench import BenchConfig, run_bench
rows = run_bench(BenchConfig(losses=("ProxyAnchor", "MFCWMS"), seeds=3))
"""

import contextlib
import json
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..catalog import LOSSES, get_entry
from ..datasets import DATASETS, SOURCE_LICENSES, load_dataset
from . import report, scheduler
from .baseline import untrained_test_embeddings
from .features import prepare_inputs
from .metrics import PRIMARY
from .protocol import BenchConfig, make_split, quick_config
from .result import (
    UNTRAINED,
    BenchFileError,
    add_wall_time,
    earlier_wall_times,
    read_json,
    run_folder,
    write_json,
)
from .runs import run_all

__all__ = ["LOSSES", "BenchConfig", "load_data", "quick_config", "run_bench"]


def load_data(config):
    return load_dataset(config.data, config.image_size, config.cache)


def check_config(config, in_features, num_classes):
    """Build every requested loss once, so that a bad combination fails now and
    not after an hour of other runs."""
    for name in config.losses:
        entry = get_entry(name)
        try:
            entry.make_embedder(in_features, config.embedding_size)
            entry.build(num_classes, config.embedding_size)
        except (ValueError, TypeError) as e:
            raise ValueError(f"loss {name} cannot be built with these settings: {e}") from e


def run_bench(config, file=None):
    """Run the benchmark of ``config``; print and write the report. Returns the table rows."""
    file = file or sys.stderr
    start = time.perf_counter()
    out_dir = Path(config.out) / config.folder_name()
    print(f"pml-fieldlosses bench -> {out_dir}", file=file)
    dataset, split, inputs, data_seconds = prepare(config, out_dir, file)
    earlier = earlier_wall_times(out_dir)  # a bad file fails now, not after the runs
    try:  # an interrupted or failed invocation's time counts too
        rows = _run_and_report(config, out_dir, dataset, split, inputs, file, start, earlier, data_seconds)
    finally:
        seconds = time.perf_counter() - start
        total, invocations = add_wall_time(out_dir, seconds)
    print(
        f"wall time: {seconds:.0f} s ({invocations} invocation(s) on this folder: {total:.0f} s)",
        file=sys.stdout,
    )
    return rows


def _run_and_report(config, out_dir, dataset, split, inputs, file, start, earlier, data_seconds):
    results = run_all(inputs, config, out_dir, file=file, backend=backend(config))
    rows = report.summarize(results)
    info = {
        "data": _describe(config, dataset),
        "train_classes": split.num_train_classes,
        "val_classes": len(np.unique(split.val_labels)),
        "test_classes": len(np.unique(split.test_labels)),
        "train_images": len(split.train),
        "val_images": len(split.val),
        "test_images": len(split.test),
        "wall_seconds": sum(earlier) + time.perf_counter() - start,
        "wall_note": f"the sum of {len(earlier) + 1} invocation(s) up to this report; "
        f"this one included {data_seconds:.0f} s of data loading"
        + (f" and {inputs.seconds:.0f} s of feature extraction" if inputs.seconds else ""),
        "licenses": {v: SOURCE_LICENSES[v] for v in set(dataset.sources) if v in SOURCE_LICENSES},
    }
    report.write_csv(rows, out_dir / "results.csv")
    with open(out_dir / "report_log.txt", "w") as log, contextlib.redirect_stderr(log):
        made = make_plots(results, rows, dataset, inputs, config, out_dir, file)
    report.write_markdown(rows, out_dir / "README.md", config, info, made)
    write_json(out_dir / "summary.json", {"rows": rows, "info": info})
    print("\n" + report.text_table(rows), file=sys.stdout)
    print(f"\nreport: {out_dir / 'README.md'}", file=sys.stdout)
    return rows


def backend(config):
    """Where the runs go: the local process pool, or Ray with ``config.ray_address``."""
    if config.ray_address is None:
        return scheduler.run_jobs
    from .ray_backend import ray_backend

    address = None if config.ray_address == "local" else config.ray_address
    return ray_backend(address, torch.device(config.device).type)


def prepare(config, out_dir, file, selection=False):
    """Load the data, check (or write) the folder's protocol.json, split, prepare
    the runs' inputs and check that every loss builds. Returns (dataset,
    split, inputs, seconds spent loading the data)."""
    t = time.perf_counter()
    dataset = load_data(config)
    data_seconds = time.perf_counter() - t
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_or_write_protocol(out_dir, config.protocol(selected=not selection), dataset.fingerprint())
    split = make_split(dataset, config.val_fraction)
    print(
        f"data: {dataset.name}, {len(dataset.images)} images of {dataset.num_classes} classes at "
        f"{dataset.image_size} px ({data_seconds:.0f} s); classes train/val/test "
        f"{split.num_train_classes}/{len(np.unique(split.val_labels))}/{len(np.unique(split.test_labels))}",
        file=file,
    )
    inputs = prepare_inputs(dataset, split, config, file=file)
    if inputs.seconds:
        print(f"frozen features computed and cached in {inputs.seconds:.0f} s", file=file)
    check_config(config, inputs.in_features, split.num_train_classes)
    return dataset, split, inputs, data_seconds


def make_plots(results, rows, dataset, inputs, config, out_dir, file=None):
    """Draw the figures; returns [(title, file name)] of those made."""
    from . import plots  # matplotlib (and its Agg backend) only when there is something to draw

    made = []
    plots.learning_curves(results, out_dir / "learning_curves.png")
    made.append(("Learning curves (validation MAP@R)", "learning_curves.png"))
    plots.time_per_epoch(results, out_dir / "time_per_epoch.png")
    made.append(("Training time per epoch", "time_per_epoch.png"))
    trained = [r for r in rows if r["loss"] != UNTRAINED]
    if not trained:
        return made
    best = trained[0]["loss"]
    path = run_folder(out_dir, best, 0) / "test_embeddings.npz"
    try:
        saved = read_embeddings(path, len(inputs.split.test))
    except BenchFileError as e:
        print(f"warning: {e}; the report has no retrieval figures", file=file)
        return made
    if saved is not None:
        embeddings = {UNTRAINED: untrained_test_embeddings(inputs, config)[0], best: saved[0]}
        labels = saved[1]
        images = dataset.images[inputs.split.test]
        plots.retrieval_grid(images, labels, embeddings, out_dir / "retrieval_grid.png")
        made.append((f"Retrieval: {UNTRAINED} vs {best} (best {PRIMARY}), seed 0", "retrieval_grid.png"))
        plots.embedding_map(labels, embeddings, out_dir / "embedding_map.png")
        made.append(("2-D map of test embeddings", "embedding_map.png"))
    return made


def read_embeddings(path, rows):
    """(float32 embeddings, labels) saved in ``path`` for ``rows`` test images,
    None if there is no such file; BenchFileError naming a bad one."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            embeddings, labels = saved["embeddings"].astype(np.float32), saved["labels"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise BenchFileError(f"{path} is not a saved embedding file ({e!r})") from None
    if embeddings.ndim != 2 or embeddings.shape[0] != rows or labels.shape != (rows,):
        raise BenchFileError(
            f"{path} holds embeddings {embeddings.shape} and labels {labels.shape}, expected {rows} rows"
        )
    return embeddings, labels


def _describe(config, dataset):
    if config.data in DATASETS:
        sources = ", ".join(sorted(set(dataset.sources)))
        return f"{DATASETS[config.data][1]} ({sources})"
    return f"image folder {config.data}"


def _check_or_write_protocol(out_dir, protocol, data_fingerprint):
    """Finished runs are reused only for the same settings and the same data."""
    path = out_dir / "protocol.json"
    protocol = {**protocol, "data_fingerprint": data_fingerprint}
    if path.exists():
        try:
            saved = read_json(path)
        except BenchFileError as e:
            raise BenchFileError(
                f"{e}; use another --out, or delete the folder (rm -r '{out_dir}')"
            ) from None
        if saved != json.loads(json.dumps(protocol)):
            raise RuntimeError(
                f"{out_dir} holds results of other settings or other data; use another --out or delete it"
            )
        return
    write_json(path, protocol)

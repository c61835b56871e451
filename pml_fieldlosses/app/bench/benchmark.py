"""``pml-fieldlosses bench``: every loss of the config and the untrained row, with every
seed, through the pipeline; then the report (results.csv, summary.json, README.md, then
the figures) and the table on the terminal.

The results folder is the command's alone while it runs (pipeline.hold_folders: a second
command on it stops at once, naming the process that holds it). The table and summary
are written before the figures, so that a figure that cannot be drawn costs only itself
(figures.py); every file is written whole or not at all."""

import sys
import time

import numpy as np

from ..backbones import get_backbone
from ..datasets import DATASETS, SOURCE_LICENSES
from . import report
from .figures import make_plots
from .pipeline import Part, hold_folders, prepare_part, report_log, wall_time
from .result import write_json


def run_bench(config, file=None):
    """Run the benchmark of ``config``; print and write the report. Returns the table rows."""
    file = file or sys.stderr
    start = time.perf_counter()
    part = Part(config)
    with hold_folders([part.folder], file):
        print(f"pml-fieldlosses bench -> {part.folder}", file=file)
        prepared = prepare_part(part, file)
        # the wall time is recorded in the folder once its protocol is checked (a folder of other
        # settings is left alone); it counts from the start of this invocation
        with wall_time(part.folder, start, file) as clock:
            return write_report(prepared, prepared.run(file), clock, file)


def write_report(prepared, results, clock, file):
    """The report of the bench's ``results`` in its folder, and its table on the terminal. Returns the rows."""
    config, out_dir = prepared.part.config, prepared.part.folder
    dataset, split, inputs = prepared.dataset, prepared.split, prepared.inputs
    rows = report.summarize(results)
    info = {
        "data": describe(config, dataset),
        "train_classes": split.num_train_classes,
        "val_classes": len(np.unique(split.val_labels)),
        "test_classes": len(np.unique(split.test_labels)),
        "train_images": len(split.train),
        "val_images": len(split.val),
        "test_images": len(split.test),
        "wall_seconds": clock.seconds(),
        "wall_note": f"the sum of {clock.invocations} invocation(s) up to this report; "
        f"this one included {prepared.data_seconds:.0f} s of data loading"
        + (f" and {inputs.seconds:.0f} s of feature extraction" if inputs.seconds else ""),
        "licenses": {v: SOURCE_LICENSES[v] for v in set(dataset.sources) if v in SOURCE_LICENSES},
    }
    report.write_csv(rows, out_dir / "results.csv")
    write_json(out_dir / "summary.json", {"rows": rows, "info": info})
    report.write_markdown(rows, out_dir / "README.md", config, info, [])  # the figures come next
    with report_log(out_dir):
        figures = make_plots(results, rows, dataset, inputs, config, out_dir, file)
    report.write_markdown(rows, out_dir / "README.md", config, info, figures.made, figures.skipped)
    print("\n" + report.text_table(rows, get_backbone(config.backbone).trunk), file=sys.stdout)
    print(f"\nreport: {out_dir / 'README.md'}", file=sys.stdout)
    return rows


MAX_NAMED_SOURCES = 40


def describe(config, dataset):
    """The data in words, for the report."""
    if config.data in DATASETS:
        sources = sorted(set(dataset.sources))
        # a few vendors or sets by name; the glyphs' hundreds of fonts by their number
        named = ", ".join(sources) if len(sources) <= MAX_NAMED_SOURCES else f"{len(sources)} sources"
        return f"{DATASETS[config.data][1]} ({named})"
    return f"image folder {config.data}"

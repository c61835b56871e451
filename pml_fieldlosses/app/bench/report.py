"""The results table: terminal text, Markdown and CSV, each file written whole or not at
all (errors.atomic_write)."""

import csv
import io
import math

import numpy as np

from ..backbones import get_backbone
from ..catalog import get_entry
from ..errors import atomic_write
from ..stats import mean_ci
from .metrics import METRICS, PRIMARY
from .result import UNTRAINED


def summarize(results):
    """One row per loss (in first-seen order, the untrained row first): each
    metric's mean and 95 % CI half-width over seeds, mean epochs to the best
    validation MAP@R, mean training seconds per epoch."""
    names = list(dict.fromkeys(r["loss"] for r in results))
    rows = []
    for name in names:
        runs = [r for r in results if r["loss"] == name]
        row = {"loss": name, "origin": runs[0]["origin"], "seeds": len(runs)}
        for metric in METRICS:
            row[metric], row[metric + "_ci"] = mean_ci([r["test"][metric] for r in runs])
        row["best_epoch"] = float(np.mean([r["best_epoch"] for r in runs]))
        seconds = [r["seconds_per_epoch"] for r in runs if not math.isnan(r["seconds_per_epoch"])]
        row["seconds_per_epoch"] = float(np.mean(seconds)) if seconds else math.nan
        row["run_seconds"] = float(np.mean([r["run_seconds"] for r in runs]))
        rows.append(row)
    baseline = next((r for r in rows if r["loss"] == UNTRAINED), None)
    for row in rows:
        row["gain"] = row[PRIMARY] - baseline[PRIMARY] if baseline else math.nan
    trained = sorted((r for r in rows if r["loss"] != UNTRAINED), key=lambda r: -r[PRIMARY])
    return ([baseline] if baseline else []) + trained


def _pm(mean, ci):
    return f"{mean:.3f}" if math.isnan(ci) else f"{mean:.3f} ± {ci:.3f}"


def _cells(row, trunk):
    cells = [row["loss"], row["origin"], trunk]
    cells += [_pm(row[m], row[m + "_ci"]) for m in METRICS]
    cells.append("" if row["loss"] == UNTRAINED else f"{row['gain']:+.3f}")
    cells.append("" if row["loss"] == UNTRAINED else f"{row['best_epoch']:.1f}")
    cells.append("" if math.isnan(row["seconds_per_epoch"]) else f"{row['seconds_per_epoch']:.2f}")
    cells.append(str(row["seeds"]))
    return cells


HEADER = ["loss", "from", "trunk"] + list(METRICS.values()) + ["ΔMAP@R", "best ep", "s/epoch", "seeds"]


def text_table(rows, trunk):
    """The table as the command prints it; ``trunk``: what of the trunk trains (backbones.Backbone.trunk)."""
    table = [HEADER] + [_cells(r, trunk) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = [
        "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
        for line in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows, trunk):
    lines = [
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * (len(HEADER) - 3)) + "|",
    ]
    lines += ["| " + " | ".join(_cells(r, trunk)) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(rows, path):
    fields = ["loss", "origin", "seeds"]
    for metric in METRICS:
        fields += [metric, metric + "_ci95"]
    fields += ["gain_map_at_r_vs_untrained", "epochs_to_best_val", "seconds_per_epoch", "seconds_per_run"]
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(fields)
    for r in rows:
        values = [r["loss"], r["origin"], r["seeds"]]
        for metric in METRICS:
            values += [f"{r[metric]:.5f}", f"{r[metric + '_ci']:.5f}"]
        values += [
            f"{r['gain']:.5f}",
            f"{r['best_epoch']:.2f}",
            f"{r['seconds_per_epoch']:.4f}",
            f"{r['run_seconds']:.2f}",
        ]
        writer.writerow(values)
    with atomic_write(path, "wb", doing="writing the table") as f:
        f.write(text.getvalue().encode())


def hyperparameter_text(name):
    """``PFML delta=0.4``; a name that sets its value (``PFML[delta=0.3]``) says it already."""
    if "[" in name:
        return name
    entry = get_entry(name)
    return f"{name} {entry.tuned}={entry.value:g}"


def write_markdown(rows, path, config, info, plots, skipped=()):
    """The report: settings, the table, how to read it, the plots ([(title, file name)]),
    and the figures that could not be drawn ([(file name, why)])."""
    noise = f", {config.label_noise:.0%} of the training labels corrupted" if config.label_noise else ""
    trunk = get_backbone(config.backbone).trunk
    lines = [
        f"# pml-fieldlosses bench: {config.backbone} ({trunk} trunk)",
        "",
        f"Data: {info['data']}{noise}. Backbone: {config.backbone}, {config.image_size} px, "
        f"embedding size {config.embedding_size}. Seeds: {config.seeds}. Max epochs: {config.epochs} "
        f"(early stopping, patience {config.patience}).",
        "",
        f"Classes: {info['train_classes']} for training, {info['val_classes']} for validation "
        f"(carved from the training half), {info['test_classes']} for testing "
        f"({info['train_images']} / {info['val_images']} / {info['test_images']} images).",
        "",
        markdown_table(rows, trunk),
        "",
        "Test metrics (PML's AccuracyCalculator, faiss kNN, each test image queried against the "
        "other test images) of the epoch with the best validation MAP@R; mean ± half-width of the "
        "95 % confidence interval over seeds (Student's t). ΔMAP@R: gain over the untrained row. "
        "best ep: mean epoch of the best validation MAP@R. s/epoch: training seconds per epoch "
        "(validation excluded).",
        "",
        "Tuned hyperparameter of each loss (`pml-fieldlosses select`; every other one at its "
        "published default): "
        + ", ".join(hyperparameter_text(r["loss"]) for r in rows if r["loss"] != UNTRAINED)
        + ".",
        "",
        f"Wall time: {info['wall_seconds']:.0f} s ({info['wall_note']}).",
        "",
    ]
    for title, name in plots:
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    if skipped:
        lines += ["Figures not drawn: " + "; ".join(f"`{name}` ({why})" for name, why in skipped) + ".", ""]
    lines += [
        "Files: `results.csv` (this table), `runs/<loss>/seed<k>/` (result.json, record-keeper records, "
        "log, best models), `tensorboard/` (`tensorboard --logdir tensorboard`).",
        "",
    ]
    if info.get("licenses"):
        lines += ["Image licences: " + "; ".join(sorted(set(info["licenses"].values()))) + ".", ""]
    with atomic_write(path, doing="writing the report") as f:
        f.write("\n".join(lines))

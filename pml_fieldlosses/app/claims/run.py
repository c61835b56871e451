"""``pml-fieldlosses claims``: plan the runs the claims need (each (label noise,
loss, seed) once, shared between claims), train them through the bench's pipeline
(resume, workers, Ray), measure and judge them (measures.py, by the verdict rule), and
report (report.py).

The report folder and every results folder the claims' runs go to are the command's
alone while it runs (bench.pipeline.hold_folders: a second command on any of them stops
at once, naming the process that holds it)."""

import dataclasses
import hashlib
import sys
import time
from pathlib import Path

from ..bench.pipeline import Part, hold_folders, run_plan, wall_time
from ..bench.protocol import BenchConfig, quick_config
from ..bench.runs import seed_major
from ..errors import UsageError
from . import report
from .measures import evaluate
from .table import CLAIMS, EARLY_EPOCH, get_claims, runs_needed, validate

# The budgets (the whole set is 36 loss/noise settings, 108 runs with 3 seeds): the
# bench's protocol with half its epochs and its lr steps twice as often (the same
# schedule's shape), 3 seeds (measured on emoji, 2 CPU cores: 1 223 s, features of the
# 4 views included; the aim is 30 minutes); --quick: the bench's --quick (2 seeds, 1
# augmented view) with 8 epochs instead of 12, lr step every 3, patience 3 (72 runs:
# 249 s, the aim is 5 minutes). See docs/claims.md.
FULL_BUDGET = dict(epochs=30, lr_decay_epochs=5)
QUICK_BUDGET = dict(epochs=8, lr_decay_epochs=3, patience=3)


def claims_config(quick=False, **settings):
    """The BenchConfig of the claims: the full budget or --quick, explicit settings winning."""
    settings.setdefault("out", "claims_out")
    if quick:
        return quick_config(**{**QUICK_BUDGET, **settings})
    return BenchConfig(**{**FULL_BUDGET, **settings})


def level_configs(config, claims):
    """{label noise: the BenchConfig of its runs (the losses the claims read at that noise)}."""
    return {
        level: dataclasses.replace(config, label_noise=level, losses=tuple(names))
        for level, names in runs_needed(claims).items()
    }


def report_folder(config, claims=CLAIMS):
    """The report's folder: one per data and protocol (the clean runs' folder name),
    number of seeds and set of claims, so that a run of some claims or seeds never
    overwrites the report (or adds to the wall time) of another. A subset of the claims
    is named by its first id (sorted), how many more, and a hash of the sorted ids."""
    clean = dataclasses.replace(config, label_noise=0.0)
    name = f"claims-{clean.folder_name()}-{config.seeds}seeds"
    ids = sorted(claim.id for claim in claims)
    if ids != sorted(claim.id for claim in CLAIMS):
        digest = hashlib.sha256(",".join(ids).encode()).hexdigest()[:6]
        more = f"+{len(ids) - 1}" if len(ids) > 1 else ""
        name += f"-{ids[0]}{more}-{digest}"
    return Path(config.out) / name


def check_epochs(config, claims):
    """Refuse a budget too short for a measure the claims read (the validation MAP@R
    after EARLY_EPOCH epochs)."""
    early = [c.id for c in claims if any(p.measure == "val_map_early" for p in c.comparisons)]
    if early and config.epochs < EARLY_EPOCH:
        raise UsageError(
            f"--epochs {config.epochs} is below {EARLY_EPOCH}: claim {', '.join(early)} reads the validation "
            f"MAP@R after epoch {EARLY_EPOCH}; give --epochs {EARLY_EPOCH} or more, or leave that claim out"
        )


def run_claims(config, ids=None, file=None):
    """Run the claims ``ids`` (all when None) with ``config``; print and write the
    report. Returns the evaluated claims (see ``evaluate``)."""
    file = file or sys.stderr
    start = time.perf_counter()
    claims = get_claims(ids)
    validate(claims)
    check_epochs(config, claims)
    configs = level_configs(config, claims)
    out_dir = report_folder(config, claims)
    folders = [out_dir] + [Part(c).folder for c in configs.values()]
    with hold_folders(folders, file), wall_time(out_dir, start, file) as clock:
        # a bad wall_time.json fails before any run
        print(f"pml-fieldlosses claims -> {out_dir}", file=file)
        total_runs = sum(len(c.losses) for c in configs.values()) * config.seeds
        print(f"{len(claims)} claims, {total_runs} runs ({config.seeds} seeds)", file=file)
        done = run_plan([Part(c, seed_major(c)) for c in configs.values()], file)
        runs = {(part.config.label_noise, r.loss, r.seed): r for part, _, results in done for r in results}
        evaluated = evaluate(claims, runs, config.seeds, config.epochs)
        warning = report.missing_warning(evaluated)
        if warning:
            print(warning, file=file)
        info = {
            "data": done[-1][1] if done else config.data,  # the data set's name
            "runs": len(runs),
            "folders": {level: c.folder_name() for level, c in configs.items()},
            "wall_seconds": clock.seconds(),
            "invocations": clock.invocations,
        }
        report.write(evaluated, runs, config, info, out_dir, file)
        print("\n" + report.text_table(evaluated, config, info["data"]), file=sys.stdout)
        print(f"\nreport: {out_dir / 'README.md'}", file=sys.stdout)
    return evaluated

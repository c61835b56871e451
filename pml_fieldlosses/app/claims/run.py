"""``pml-fieldlosses claims``: plan the runs the claims need (each (label noise,
loss, seed) once, shared between claims), train them with the bench's runs
(resume, workers, Ray), measure, judge by the verdict rule, and report."""

import dataclasses
import hashlib
import math
import sys
import time
from pathlib import Path

import numpy as np

from ..bench import backend, prepare
from ..bench.metrics import PRIMARY
from ..bench.protocol import BenchConfig, quick_config
from ..bench.result import add_wall_time, earlier_wall_times, write_json
from ..bench.runs import run_all
from . import report
from .table import CLAIMS, EARLY_EPOCH, get_claims, runs_needed, validate
from .verdict import INCONCLUSIVE, combine, paired_interval, verdict

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
        raise ValueError(
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
    out_dir.mkdir(parents=True, exist_ok=True)
    earlier = earlier_wall_times(out_dir)
    print(f"pml-fieldlosses claims -> {out_dir}", file=file)
    total_runs = sum(len(c.losses) for c in configs.values()) * config.seeds
    print(f"{len(claims)} claims, {total_runs} runs ({config.seeds} seeds)", file=file)
    try:
        runs, dataset_name = {}, None
        for level, level_config in configs.items():
            folder = Path(config.out) / level_config.folder_name()
            dataset, _, inputs, _ = prepare(level_config, folder, file)
            dataset_name = dataset.name
            jobs = [(name, seed) for seed in range(config.seeds) for name in level_config.losses]
            results = run_all(inputs, level_config, folder, file=file, jobs=jobs, backend=backend(level_config))
            runs.update({(level, r.loss, r.seed): r for r in results})
        evaluated = evaluate(claims, runs, config.seeds, config.epochs)
        warning = missing_warning(evaluated)
        if warning:
            print(warning, file=file)
        info = {
            "data": config.data if dataset_name is None else dataset_name,
            "runs": len(runs),
            "folders": {level: c.folder_name() for level, c in configs.items()},
            "wall_seconds": sum(earlier) + time.perf_counter() - start,
            "invocations": len(earlier) + 1,
        }
        report.write(evaluated, runs, config, info, out_dir, file)
    finally:
        seconds = time.perf_counter() - start
        total, invocations = add_wall_time(out_dir, seconds)
    print("\n" + report.text_table(evaluated, config, info["data"]), file=sys.stdout)
    print(f"\nreport: {out_dir / 'README.md'}", file=sys.stdout)
    print(
        f"wall time: {seconds:.0f} s ({invocations} invocation(s) on this folder: {total:.0f} s)",
        file=sys.stdout,
    )
    return evaluated


def measure(runs, name, measure_name, level, seed):
    """The value of ``measure_name`` (table.MEASURES) for one run; nan when the run
    has none (a loss without proxies or a result written before proxy_distance, a run
    stopped before EARLY_EPOCH, a nan test MAP@R)."""
    run = runs[(level, name, seed)]
    if measure_name == "map":
        return _test_map(run)
    if measure_name == "noise_drop":
        return _test_map(runs[(0.0, name, seed)]) - _test_map(run)
    if measure_name == "epochs_to_best":
        return float(run.best_epoch)
    if measure_name == "val_map_early":
        history = run.val_history
        if EARLY_EPOCH not in history["epoch"]:
            return math.nan
        return history["map_at_r"][history["epoch"].index(EARLY_EPOCH)]
    if measure_name == "proxy_distance":
        return math.nan if run.proxy_distance is None else run.proxy_distance
    raise ValueError(f"unknown measure {measure_name!r}")


def _test_map(run):
    value = (run.test or {}).get(PRIMARY)
    return math.nan if value is None else float(value)


def arm_values(runs, arm, measure_name, level, seeds):
    """One value per seed: the mean over the arm's losses."""
    return [float(np.mean([measure(runs, name, measure_name, level, s) for name in arm])) for s in range(seeds)]


def censored_runs(runs, comparison, seeds, max_epochs):
    """The runs of a comparison whose measure is only a lower bound: for the epoch of
    the best validation MAP@R, the runs that used all ``max_epochs`` epochs (early
    stopping never fired, so a later epoch might have been better)."""
    if comparison.measure != "epochs_to_best":
        return []
    names = (*comparison.a, *comparison.b)
    keys = [(comparison.noise, name, s) for name in names for s in range(seeds)]
    return [key for key in keys if runs[key].epochs_run >= max_epochs]


def missing_values(runs, comparison, seeds):
    """[(loss, seed)] of the comparison's runs without a value of its measure (nan)."""
    names = (*comparison.a, *comparison.b)
    return [
        (name, s)
        for name in names
        for s in range(seeds)
        if math.isnan(measure(runs, name, comparison.measure, comparison.noise, s))
    ]


def missing_warning(evaluated):
    """One line naming the comparisons with missing values, or None."""
    cases = [
        f"{e['claim'].id} {p['comparison'].measure}: {report.missing_text(p['missing'])}"
        for e in evaluated
        for p in e["parts"]
        if p["missing"]
    ]
    if not cases:
        return None
    return "warning: no value (inconclusive) for " + "; ".join(cases)


def evaluate(claims, runs, seeds, max_epochs):
    """[{"claim": Claim, "verdict": str, "parts": [{comparison, a, b, interval,
    censored, missing, verdict}]}]. A comparison with censored runs, or with runs
    that have no value of its measure (``missing``: [(loss, seed)]), is inconclusive."""
    evaluated = []
    for claim in claims:
        parts = []
        for comparison in claim.comparisons:
            a = arm_values(runs, comparison.a, comparison.measure, comparison.noise, seeds)
            b = arm_values(runs, comparison.b, comparison.measure, comparison.noise, seeds)
            interval = paired_interval(a, b)
            censored = censored_runs(runs, comparison, seeds, max_epochs)
            missing = missing_values(runs, comparison, seeds)
            parts.append(
                {
                    "comparison": comparison,
                    "a": a,
                    "b": b,
                    "interval": interval,
                    "censored": len(censored),
                    "missing": missing,
                    "verdict": INCONCLUSIVE if censored or missing else verdict(interval, comparison.direction),
                }
            )
        evaluated.append({"claim": claim, "parts": parts, "verdict": combine(p["verdict"] for p in parts)})
    return evaluated


def summary(evaluated):
    """JSON-ready form of ``evaluate``'s result."""
    return [
        {
            "id": e["claim"].id,
            "paper": e["claim"].paper,
            "section": e["claim"].section,
            "claim": e["claim"].claim,
            "experiment": e["claim"].experiment,
            "verdict": e["verdict"],
            "comparisons": [
                {
                    "label": p["comparison"].label,
                    "a": list(p["comparison"].a),
                    "b": list(p["comparison"].b),
                    "measure": p["comparison"].measure,
                    "noise": p["comparison"].noise,
                    "direction": p["comparison"].direction,
                    "a_per_seed": p["a"],
                    "b_per_seed": p["b"],
                    **dataclasses.asdict(p["interval"]),
                    "censored_runs": p["censored"],
                    "missing": [[name, s] for name, s in p["missing"]],
                    "verdict": p["verdict"],
                }
                for p in e["parts"]
            ],
        }
        for e in evaluated
    ]


def write_summary(evaluated, info, path):
    write_json(path, {"info": info, "claims": summary(evaluated)})

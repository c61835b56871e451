"""The claims' measures: the value of a measure for one run, an arm's values per seed,
the comparisons evaluated by the verdict rule (censored and missing values included), and
their JSON-ready summary. ``runs`` is {(label noise, loss, seed): RunResult}."""

import dataclasses
import math

import numpy as np

from ..bench.metrics import PRIMARY
from .table import EARLY_EPOCH
from .verdict import INCONCLUSIVE, combine, paired_interval, verdict


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
    return [
        float(np.mean([measure(runs, name, measure_name, level, s) for name in arm])) for s in range(seeds)
    ]


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
                    "verdict": INCONCLUSIVE
                    if censored or missing
                    else verdict(interval, comparison.direction),
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

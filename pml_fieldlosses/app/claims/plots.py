"""One figure per claim: what was measured (each arm per seed, or MAP@R against
label noise) and each comparison's paired difference with its 95 % interval, written
whole or not at all (bench.plots.save)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..bench.plots import save
from ..stats import mean_ci
from .measures import arm_values, measure
from .table import MEASURES

COLOURS = {"reproduced": "tab:green", "not reproduced": "tab:red", "inconclusive": "tab:gray"}


def _arm_label(arm):
    return "\n".join(arm)


def _measured_panels(evaluated, runs, seeds):
    """[(measure, noise, [arms])] in first-use order."""
    panels = {}
    for p in evaluated["parts"]:
        c = p["comparison"]
        arms = panels.setdefault((c.measure, c.noise), [])
        for arm in (c.a, c.b):
            if arm not in arms:
                arms.append(arm)
    return [(m, noise, arms) for (m, noise), arms in panels.items()]


def _draw_arms(ax, runs, measure_name, noise, arms, seeds):
    for x, arm in enumerate(arms):
        values = arm_values(runs, arm, measure_name, noise, seeds)
        ax.plot([x] * len(values), values, "o", color="tab:blue", alpha=0.5, ms=4)
        finite = [v for v in values if not math.isnan(v)]
        if finite:
            ax.plot([x - 0.25, x + 0.25], [np.mean(finite)] * 2, color="k", lw=2)
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels([_arm_label(a) for a in arms], fontsize=7, rotation=30, ha="right")
    noise_text = f" ({noise:.0%} label noise)" if noise and measure_name != "noise_drop" else ""
    ax.set_ylabel(MEASURES[measure_name][1] + noise_text, fontsize=8)
    ax.grid(alpha=0.3)


def _draw_noise(ax, evaluated, runs, seeds):
    """Test MAP@R against label noise, one line per loss (mean ± 95 % CI over seeds)."""
    names = list(dict.fromkeys(n for p in evaluated["parts"] for n in p["comparison"].a + p["comparison"].b))
    levels = sorted({0.0} | {p["comparison"].noise for p in evaluated["parts"]})
    for name in names:
        stats = [mean_ci([measure(runs, name, "map", level, s) for s in range(seeds)]) for level in levels]
        means = [m for m, _ in stats]
        errors = [0 if math.isnan(ci) else ci for _, ci in stats]
        ax.errorbar([100 * level for level in levels], means, yerr=errors, marker="o", capsize=3, label=name)
    ax.set_xlabel("training labels changed (%)")
    ax.set_ylabel("test MAP@R")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _draw_forest(ax, evaluated):
    parts = evaluated["parts"]
    for y, p in enumerate(parts):
        interval = p["interval"]
        colour = COLOURS[p["verdict"]]
        if not math.isnan(interval.low):
            ax.plot([interval.low, interval.high], [y, y], color=colour, lw=2)
        ax.plot(interval.mean, y, "o", color=colour)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(parts)))
    ax.set_yticklabels([p["comparison"].label for p in parts], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "a − b: mean and 95 % CI over seeds\n(green reproduced, red not, grey inconclusive)", fontsize=8
    )
    ax.grid(alpha=0.3)


def claim_figure(evaluated, runs, seeds, path):
    claim = evaluated["claim"]
    panels = [] if claim.plot == "noise" else _measured_panels(evaluated, runs, seeds)
    count = 1 + (1 if claim.plot == "noise" else len(panels))
    fig, axes = plt.subplots(1, count, figsize=(4.6 * count + 2, 3.8), squeeze=False)
    axes = list(axes[0])
    if claim.plot == "noise":
        _draw_noise(axes[0], evaluated, runs, seeds)
    for ax, (measure_name, noise, arms) in zip(axes, panels):
        _draw_arms(ax, runs, measure_name, noise, arms, seeds)
    _draw_forest(axes[-1], evaluated)
    fig.suptitle(f"{claim.id}: {evaluated['verdict']} — {claim.claim}", fontsize=9)
    fig.tight_layout()
    save(fig, path, dpi=100)

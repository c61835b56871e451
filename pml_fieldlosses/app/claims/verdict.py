"""The verdict rule, stated once (RULE) and applied to every comparison.

A comparison pairs two arms over the same seeds (same seed: same initialisation,
batches and label noise); the difference d_s = a_s - b_s of seed s has mean m and
the 95 % Student-t interval m ± t(0.975, n-1) · sd(d) / sqrt(n) (scipy's paired
t-interval). A claimed direction "greater" (a > b) is

* reproduced when the interval lies above 0,
* not reproduced when it lies below 0 (the opposite, significantly),
* inconclusive otherwise (it contains 0, or there are fewer than 2 seeds);

"less" is the mirror image. A claim of no effect ("none") is not reproduced
when the interval excludes 0 and reproduced when it lies within ±EQUIVALENCE
(an effect smaller than that is no effect); inconclusive otherwise. A claim with
several comparisons is reproduced when all of them are, not reproduced when any
is, and inconclusive otherwise.
"""

import math
from dataclasses import dataclass

import numpy as np

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
DIRECTIONS = ("greater", "less", "none")
CONFIDENCE = 0.95
EQUIVALENCE = 0.01  # the largest MAP@R difference that "no significant effect" allows

RULE = (
    "Each comparison is the paired difference a - b over seeds (the same seed trains both arms: "
    "same initialisation, batches and label noise), with its 95 % Student-t confidence interval. "
    "Claimed a > b (or a < b): reproduced when the interval excludes 0 in the claimed direction, "
    "not reproduced when it excludes 0 in the other direction, inconclusive when it contains 0. "
    f"Claimed no effect: reproduced when the interval lies within ±{EQUIVALENCE:g} MAP@R, not "
    "reproduced when it excludes 0, inconclusive otherwise. A comparison of the epoch of the best "
    "validation MAP@R is inconclusive (censored) when a run of either arm used all its epochs: "
    "early stopping never fired, so its best epoch is only a lower bound. A comparison with a run "
    "that has no value of its measure (named in the CI column) is inconclusive. A claim with several "
    "comparisons is reproduced when all are, not reproduced when any is, inconclusive otherwise."
)


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int


def paired_interval(a, b, confidence=CONFIDENCE):
    """Mean of the paired differences a - b and its Student-t interval
    (nan bounds for fewer than 2 pairs; the mean itself when all differences are equal)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired values need the same length, got {a.shape} and {b.shape}")
    if not len(a):
        raise ValueError("no paired values")
    d = a - b
    mean = float(d.mean())
    if len(d) < 2:
        return Interval(mean, math.nan, math.nan, len(d))
    from scipy.stats import t

    half = float(t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return Interval(mean, mean - half, mean + half, len(d))


def verdict(interval, direction, equivalence=EQUIVALENCE):
    """The verdict of one comparison by the rule above."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    low, high = interval.low, interval.high
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if direction == "none":
        if low > 0 or high < 0:
            return NOT_REPRODUCED
        return REPRODUCED if -equivalence <= low and high <= equivalence else INCONCLUSIVE
    above, below = low > 0, high < 0
    if direction == "less":
        above, below = below, above
    if above:
        return REPRODUCED
    return NOT_REPRODUCED if below else INCONCLUSIVE


def combine(verdicts):
    """A claim's verdict from those of its comparisons."""
    verdicts = list(verdicts)
    if not verdicts:
        raise ValueError("a claim needs at least one comparison")
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return NOT_REPRODUCED if NOT_REPRODUCED in verdicts else INCONCLUSIVE

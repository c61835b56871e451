"""The confidence intervals reported over seeds (the bench) and folds (the pb runner)."""

import math

import numpy as np


def t_quantile_975(dof):
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def mean_ci(values):
    """Mean and half-width of the 95 % confidence interval (Student's t) of the
    mean; the half-width is 0 for identical values and nan for a single value."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, math.nan
    sem = values.std(ddof=1) / math.sqrt(len(values))
    return mean, float(t_quantile_975(len(values) - 1) * sem)

"""Retrieval metrics (PML's AccuracyCalculator, faiss kNN) and their summary over seeds."""

import math

import numpy as np
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

# AccuracyCalculator's names -> the table's
METRICS = {
    "mean_average_precision_at_r": "MAP@R",
    "precision_at_1": "P@1",
    "r_precision": "R-Prec",
}
PRIMARY = "mean_average_precision_at_r"


def accuracy_calculator():
    """k = "max_bin_count": as many neighbours as the largest class needs for
    MAP@R and R-precision, and no more (k=None would rank all references)."""
    return AccuracyCalculator(include=tuple(METRICS), k="max_bin_count", device=torch.device("cpu"))


def level0(accuracies):
    """{metric: value} from a tester's accuracies ("<metric>_level0" keys)."""
    return {m: float(accuracies[f"{m}_level0"]) for m in METRICS}


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

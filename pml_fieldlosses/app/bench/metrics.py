"""Retrieval metrics (PML's AccuracyCalculator, faiss kNN)."""

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

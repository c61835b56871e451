"""Our losses (PML's own: ``pytorch_metric_learning.losses``).

Exports only this package's classes, so that nothing here shadows a PML name.
"""

from .base_mean_field_loss import BaseMeanFieldLoss
from .base_potential_loss import BasePotentialLoss
from .class_wise_multi_similarity_loss import ClassWiseMultiSimilarityLoss
from .contrastive_potential_loss import ContrastivePotentialLoss
from .cross_batch_memory import CrossBatchMemoryWithClassWiseMultiSimilarity
from .mean_field_class_wise_multi_similarity_loss import MeanFieldClassWiseMultiSimilarityLoss
from .mean_field_contrastive_loss import MeanFieldContrastiveLoss
from .mixins import CheckedForwardMixin
from .potential_field_loss import PotentialFieldLoss
from .relational_loss import RelationalLoss

# every loss this package adds to PML's (what pml_fieldlosses.register() registers)
ADDED_LOSSES = [
    ClassWiseMultiSimilarityLoss,
    ContrastivePotentialLoss,
    MeanFieldClassWiseMultiSimilarityLoss,
    MeanFieldContrastiveLoss,
    PotentialFieldLoss,
    RelationalLoss,
]

__all__ = [
    "ADDED_LOSSES",
    "BaseMeanFieldLoss",
    "BasePotentialLoss",
    "CheckedForwardMixin",
    "ClassWiseMultiSimilarityLoss",
    "ContrastivePotentialLoss",
    "CrossBatchMemoryWithClassWiseMultiSimilarity",
    "MeanFieldClassWiseMultiSimilarityLoss",
    "MeanFieldContrastiveLoss",
    "PotentialFieldLoss",
    "RelationalLoss",
]

"""Every loss of pytorch_metric_learning.losses, plus ours."""

from pytorch_metric_learning.losses import *  # noqa: F401,F403

from .base_mean_field_loss import BaseMeanFieldLoss
from .base_potential_loss import BasePotentialLoss
from .class_wise_multi_similarity_loss import ClassWiseMultiSimilarityLoss
from .contrastive_potential_loss import ContrastivePotentialLoss
from .cross_batch_memory import CrossBatchMemory  # PML's, also accepting ClassWiseMultiSimilarityLoss
from .mean_field_class_wise_multi_similarity_loss import MeanFieldClassWiseMultiSimilarityLoss
from .mean_field_contrastive_loss import MeanFieldContrastiveLoss
from .mixins import CheckedForwardMixin
from .potential_field_loss import PotentialFieldLoss
from .relational_loss import RelationalLoss

FIELD_LOSSES = [
    ClassWiseMultiSimilarityLoss,
    ContrastivePotentialLoss,
    MeanFieldClassWiseMultiSimilarityLoss,
    MeanFieldContrastiveLoss,
    PotentialFieldLoss,
    RelationalLoss,
]

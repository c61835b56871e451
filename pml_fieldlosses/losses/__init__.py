"""Our losses (PML's own: ``pytorch_metric_learning.losses``).

Exports only this package's classes, so that nothing here shadows a PML name. The losses
themselves are exported from their one declaration (``declarations``).
"""

from .declarations import DECLARATIONS as _DECLARATIONS
from .base_mean_field_loss import BaseMeanFieldLoss
from .base_potential_loss import BasePotentialLoss
from .cross_batch_memory import CrossBatchMemoryWithClassWiseMultiSimilarity
from .mixins import CheckedForwardMixin

# every loss this package adds to PML's (what pml_fieldlosses.register() registers), by name
ADDED_LOSSES = sorted((d.loss_class for d in _DECLARATIONS), key=lambda cls: cls.__name__)
globals().update({cls.__name__: cls for cls in ADDED_LOSSES})

__all__ = sorted(
    [
        "ADDED_LOSSES",
        "BaseMeanFieldLoss",
        "BasePotentialLoss",
        "CheckedForwardMixin",
        "CrossBatchMemoryWithClassWiseMultiSimilarity",
        *(cls.__name__ for cls in ADDED_LOSSES),
    ]
)

import pytorch_metric_learning.losses as pml_losses

import pml_fieldlosses
from pml_fieldlosses import losses


def test_losses_namespace_has_pml_and_ours():
    assert losses.ProxyAnchorLoss is pml_losses.ProxyAnchorLoss
    assert issubclass(losses.CrossBatchMemory, pml_losses.CrossBatchMemory)  # also accepts CWMS
    for cls in losses.FIELD_LOSSES:
        assert getattr(losses, cls.__name__) is cls
        assert issubclass(cls, pml_losses.BaseMetricLossFunction)
    assert {cls.__name__ for cls in losses.FIELD_LOSSES} >= {
        "MeanFieldContrastiveLoss",
        "ClassWiseMultiSimilarityLoss",
        "MeanFieldClassWiseMultiSimilarityLoss",
    }


def test_register_is_explicit_and_idempotent():
    names = pml_fieldlosses.register()
    assert names == pml_fieldlosses.register()
    for name in names:
        assert getattr(pml_losses, name) is getattr(losses, name)
    loss = getattr(pml_losses, "MeanFieldContrastiveLoss")(num_classes=3, embedding_size=2)
    assert isinstance(loss, losses.MeanFieldContrastiveLoss)

import pytorch_metric_learning.losses as pml_losses

import pml_fieldlosses
from pml_fieldlosses import losses


def test_losses_namespace_has_only_ours():
    """No star import of PML: nothing in our namespace shadows or re-exports a PML name."""
    assert losses.__all__ == sorted(losses.__all__)
    public = {name for name in vars(losses) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(losses, name)).__name__ == "module"}
    assert public - modules == set(losses.__all__)
    assert not set(losses.__all__) & set(dir(pml_losses))
    for name in losses.__all__:
        obj = getattr(losses, name)
        assert name == "ADDED_LOSSES" or obj.__module__.startswith("pml_fieldlosses.losses"), name
    assert not hasattr(losses, "ProxyAnchorLoss") and not hasattr(losses, "CrossBatchMemory")
    # our memory bank says what it adds to PML's
    assert issubclass(losses.CrossBatchMemoryWithClassWiseMultiSimilarity, pml_losses.CrossBatchMemory)


def test_added_losses_are_all_our_losses():
    for cls in losses.ADDED_LOSSES:
        assert getattr(losses, cls.__name__) is cls
        assert issubclass(cls, pml_losses.BaseMetricLossFunction)
    assert {cls.__name__ for cls in losses.ADDED_LOSSES} >= {
        "MeanFieldContrastiveLoss",
        "ClassWiseMultiSimilarityLoss",
        "MeanFieldClassWiseMultiSimilarityLoss",
    }
    concrete = {
        getattr(losses, name)
        for name in losses.__all__
        if isinstance(getattr(losses, name), type)
        and issubclass(getattr(losses, name), pml_losses.BaseMetricLossFunction)
        and not name.startswith("Base")
    }
    assert concrete == set(losses.ADDED_LOSSES)
    assert [cls.__name__ for cls in losses.ADDED_LOSSES] == sorted(
        cls.__name__ for cls in losses.ADDED_LOSSES
    )


def test_register_is_explicit_and_idempotent():
    names = pml_fieldlosses.register()
    assert names == pml_fieldlosses.register()
    assert names == [cls.__name__ for cls in losses.ADDED_LOSSES]
    for name in names:
        assert getattr(pml_losses, name) is getattr(losses, name)
    loss = pml_losses.MeanFieldContrastiveLoss(num_classes=3, embedding_size=2)
    assert isinstance(loss, losses.MeanFieldContrastiveLoss)
    assert pml_losses.CrossBatchMemory.__module__.startswith("pytorch_metric_learning")  # PML's untouched

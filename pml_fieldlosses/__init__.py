"""Physics-inspired metric-learning losses for pytorch-metric-learning."""

from . import losses, models

__version__ = "0.1.0"
__all__ = ["losses", "models", "register"]


def register():
    """Add our loss classes (``losses.ADDED_LOSSES``) to
    ``pytorch_metric_learning.losses`` so that code looking PML losses up by
    name (``getattr(pml_losses, name)``, YAML factories) finds them. None of
    their names is one of PML's, so nothing of PML's is replaced. Idempotent;
    returns the names it registered."""
    import pytorch_metric_learning.losses as pml_losses

    names = []
    for cls in losses.ADDED_LOSSES:
        if getattr(pml_losses, cls.__name__, cls) is not cls:
            raise RuntimeError(f"pytorch_metric_learning.losses already has a different {cls.__name__}")
        setattr(pml_losses, cls.__name__, cls)
        names.append(cls.__name__)
    return names

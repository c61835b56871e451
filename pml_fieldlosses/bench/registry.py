"""The losses the benchmark compares: a table of entries, each added only if
its class imports, so losses that land later join by themselves.

Hyperparameters are each loss's published defaults (PML's defaults for PML's
losses). Learnable loss parameters (proxies, class weights W, mean fields) get
their own optimiser over ``loss.parameters()`` at ``loss_lr_multiplier`` times
the embedder's learning rate (BenchConfig; 10 by default).
"""

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners


@dataclass(frozen=True)
class LossEntry:
    name: str
    origin: str  # "PML" or "ours"
    # (num_classes, embedding_size, embedder) -> loss module
    build: Callable
    # () -> miner, or None
    miner: Optional[Callable] = None
    # (in_features, embedding_size) -> embedder module, or None for Linear(in_features, embedding_size)
    embedder: Optional[Callable] = None


def optional_class(module, name):
    """``module.name`` if it imports, else None."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _entries():
    ours = "pml_fieldlosses.losses"
    MFCont = optional_class(ours, "MeanFieldContrastiveLoss")
    CWMS = optional_class(ours, "ClassWiseMultiSimilarityLoss")
    MFCWMS = optional_class(ours, "MeanFieldClassWiseMultiSimilarityLoss")
    PFML = optional_class(ours, "PotentialFieldLoss")
    CPML = optional_class(ours, "ContrastivePotentialLoss")
    Relational = optional_class("pml_fieldlosses.losses.relational_loss", "RelationalLoss")
    RelationalEmbedder = optional_class("pml_fieldlosses.models", "RelationalEmbedder")

    table = [
        LossEntry("ProxyAnchor", "PML", lambda C, D, e: pml_losses.ProxyAnchorLoss(C, D)),
        LossEntry(
            "MultiSimilarity",
            "PML",
            lambda C, D, e: pml_losses.MultiSimilarityLoss(),
            miner=lambda: miners.MultiSimilarityMiner(),
        ),
        LossEntry("Contrastive", "PML", lambda C, D, e: pml_losses.ContrastiveLoss()),
        LossEntry("CosFace", "PML", lambda C, D, e: pml_losses.CosFaceLoss(C, D)),
        LossEntry("ArcFace", "PML", lambda C, D, e: pml_losses.ArcFaceLoss(C, D)),
        LossEntry("NormSoftmax", "PML", lambda C, D, e: pml_losses.NormalizedSoftmaxLoss(C, D)),
    ]
    if MFCont is not None:
        table.append(LossEntry("MFCont", "ours", lambda C, D, e: MFCont(C, D)))
    if CWMS is not None:
        table.append(LossEntry("CWMS", "ours", lambda C, D, e: CWMS()))
    if MFCWMS is not None:
        table.append(LossEntry("MFCWMS", "ours", lambda C, D, e: MFCWMS(C, D)))
    if PFML is not None:
        table.append(LossEntry("PFML", "ours", lambda C, D, e: PFML(C, D)))
    if CPML is not None:
        table.append(LossEntry("CPML", "ours", lambda C, D, e: CPML(C, D)))
    if Relational is not None and RelationalEmbedder is not None:
        branches = 4
        table.append(
            LossEntry(
                "DRML-ProxyAnchor",
                "ours",
                lambda C, D, e: Relational(
                    e,
                    pml_losses.ProxyAnchorLoss(C, D),
                    branch_losses=lambda: pml_losses.ProxyAnchorLoss(C, D // branches),
                ),
                embedder=lambda F, D: RelationalEmbedder(F, D, num_branches=branches),
            )
        )
    return {entry.name: entry for entry in table}


LOSSES = _entries()


def default_losses():
    return tuple(LOSSES)


def get_entry(name):
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(LOSSES)}")
    return LOSSES[name]

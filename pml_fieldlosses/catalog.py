"""The one table of losses that the bench, the tests and the benchmark scripts
read: PML's losses (``pytorch_metric_learning.losses``) and ours
(``pml_fieldlosses.losses``). Import-light: torch, PML and this package's
losses and models only.

Each entry has one tuned hyperparameter, the one that sets its margin (or
radius, or temperature), with three candidates: the published default (PML's
default for PML's losses, the paper's or official code's for ours) and the
values that halve and double its distance margin. ``pml-fieldlosses select``
trains every candidate of every loss once, with the same protocol and budget,
on the validation classes (never the test classes) and prints the best; the
result for the default data is ``SELECTED`` below, which the benchmark uses.
Every other hyperparameter keeps its published default.

A name may carry its own value, e.g. ``PFML[delta=0.3]`` (``get_entry``).
Learnable loss parameters (proxies, class weights W, mean fields) get their
own optimiser over ``loss.parameters()`` (BenchConfig.loss_lr_multiplier).
"""

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners

from . import losses
from .models import RelationalEmbedder

# The candidate the validation selection chose for the default data (emoji,
# efficientnet-lite0, 64 px, embedding 128, protocol 2; selection seed 1000);
# the table of all candidates is in docs/bench.md ("Hyperparameter selection").
SELECTED = {
    "ProxyAnchor": 0.2,
    "MultiSimilarity": 0.75,
    "Contrastive": 1.0,
    "CosFace": 0.175,
    "ArcFace": 14.3,
    "NormSoftmax": 0.1,
    "MFCont": 0.6,
    "CWMS": 0.9,
    "MFCWMS": 0.9,
    "PFML": 0.4,
    "CPML": 0.4,
    "DRML-ProxyAnchor": 0.2,
}
DRML_BRANCHES = 4


def linear_embedder(in_features, embedding_size):
    """The default embedder, ``Linear(in_features, embedding_size)``, initialised
    like the embedding layers of the official ProxyAnchor, mean-field and DRML
    code (kaiming-normal, mode fan_out; bias 0), i.e. at the scale of the DRML
    head's layers: with Adam and normalised embeddings the effective step size
    is lr / weight scale, so every embedder must start at the same scale."""
    layer = torch.nn.Linear(in_features, embedding_size)
    torch.nn.init.kaiming_normal_(layer.weight, mode="fan_out")
    torch.nn.init.zeros_(layer.bias)
    return layer


@dataclass(frozen=True)
class LossEntry:
    name: str
    origin: str  # "PML" or "ours"
    loss_class: type
    # the tuned hyperparameter and its candidates (the first is the published default)
    tuned: str
    grid: tuple
    value: float = None
    # () -> miner, or None
    miner: Optional[Callable] = None
    # whether loss_class takes (num_classes, embedding_size) (proxies, class weights, mean fields)
    per_class: bool = True
    # (num_classes, embedding_size, **options) -> loss, for a loss built otherwise
    make: Optional[Callable] = None
    # (in_features, embedding_size) -> embedder module, or None for linear_embedder
    embedder: Optional[Callable] = None

    def build(self, num_classes, embedding_size, **options):
        """The loss with the entry's value of its tuned hyperparameter (``options`` win)."""
        options = {self.tuned: self.value, **options}
        if self.make is not None:
            return self.make(num_classes, embedding_size, **options)
        if self.per_class:
            return self.loss_class(num_classes, embedding_size, **options)
        return self.loss_class(**options)

    def make_embedder(self, in_features, embedding_size):
        return (self.embedder or linear_embedder)(in_features, embedding_size)

    @property
    def default(self):
        return self.grid[0]

    @property
    def short_name(self):
        """The loss class's name without "Loss", e.g. PotentialField."""
        return self.loss_class.__name__.removesuffix("Loss")

    def with_value(self, value):
        return dataclasses.replace(self, value=value)

    def variant(self, value):
        """The name of this loss with its tuned hyperparameter set, e.g. PFML[delta=0.1]."""
        return f"{self.name}[{self.tuned}={value:g}]"

    def candidates(self):
        return [self.variant(v) for v in self.grid]


def _drml(C, D, margin):
    """DRML around ProxyAnchor, built like any loss (the head's branch outputs travel with
    its output); ``margin``: the ProxyAnchor margin of the representation and branch losses."""
    base = pml_losses.ProxyAnchorLoss(C, D, margin=margin)

    def branches():
        return pml_losses.ProxyAnchorLoss(C, D // DRML_BRANCHES, margin=margin)

    return losses.RelationalLoss(base, branch_losses=branches, num_branches=DRML_BRANCHES, embedding_size=D)


# grids: the published default, then the values with half and twice its distance margin
_TABLE = [
    LossEntry("ProxyAnchor", "PML", pml_losses.ProxyAnchorLoss, "margin", (0.1, 0.05, 0.2)),
    # base is a similarity threshold: distance margin 1 - base = 0.5, 0.25, 1
    LossEntry(
        "MultiSimilarity",
        "PML",
        pml_losses.MultiSimilarityLoss,
        "base",
        (0.5, 0.75, 0.0),
        miner=lambda: miners.MultiSimilarityMiner(),
        per_class=False,
    ),
    # Euclidean on the unit sphere (2: every negative pair but antipodal ones counts)
    LossEntry(
        "Contrastive", "PML", pml_losses.ContrastiveLoss, "neg_margin", (1.0, 0.5, 2.0), per_class=False
    ),
    LossEntry("CosFace", "PML", pml_losses.CosFaceLoss, "margin", (0.35, 0.175, 0.7)),
    LossEntry("ArcFace", "PML", pml_losses.ArcFaceLoss, "margin", (28.6, 14.3, 57.2)),  # degrees
    LossEntry("NormSoftmax", "PML", pml_losses.NormalizedSoftmaxLoss, "temperature", (0.05, 0.025, 0.1)),
    # cosine distance
    LossEntry("MFCont", "ours", losses.MeanFieldContrastiveLoss, "neg_margin", (0.3, 0.15, 0.6)),
    # similarity threshold: distance margin 1 - base = 0.2, 0.1, 0.4
    LossEntry("CWMS", "ours", losses.ClassWiseMultiSimilarityLoss, "base", (0.8, 0.9, 0.6), per_class=False),
    LossEntry("MFCWMS", "ours", losses.MeanFieldClassWiseMultiSimilarityLoss, "base", (0.8, 0.9, 0.6)),
    # radius of both potentials (the paper cross-validates it in [0.1, 0.3])
    LossEntry("PFML", "ours", losses.PotentialFieldLoss, "delta", (0.2, 0.1, 0.4)),
    LossEntry("CPML", "ours", losses.ContrastivePotentialLoss, "delta", (0.2, 0.1, 0.4)),
    LossEntry(
        "DRML-ProxyAnchor",
        "ours",
        losses.RelationalLoss,
        "margin",
        (0.1, 0.05, 0.2),
        make=_drml,
        embedder=lambda F, D: RelationalEmbedder(F, D, num_branches=DRML_BRANCHES),
    ),
]
LOSSES = {entry.name: entry.with_value(SELECTED.get(entry.name, entry.default)) for entry in _TABLE}

_VARIANT = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<key>\w+)=(?P<value>[^\[\]]+)\]$")


def default_losses():
    return tuple(LOSSES)


def get_entry(name):
    """The entry of ``name``: a loss of LOSSES, or one with its tuned
    hyperparameter set in the name, e.g. ``PFML[delta=0.3]``."""
    match = _VARIANT.match(name)
    base = match["name"] if match else name
    if base not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(LOSSES)}")
    entry = LOSSES[base]
    if not match:
        return entry
    if match["key"] != entry.tuned:
        raise ValueError(f"loss {base} takes [{entry.tuned}=VALUE] (its tuned hyperparameter), got {name!r}")
    try:
        value = float(match["value"])
    except ValueError:
        raise ValueError(f"{name!r}: {match['value']!r} is not a number") from None
    return dataclasses.replace(entry.with_value(value), name=name)


def published(name, **options):
    """``(num_classes, embedding_size) -> loss``: the loss ``name`` at its
    published defaults (not the bench's selected value), with ``options``."""
    entry = get_entry(name).with_value(get_entry(name).default)
    return lambda C, D: entry.build(C, D, **options)


def ours_by_class_name(mf_reg_weight=0.0):
    """{class name without "Loss": (num_classes, embedding_size) -> loss} of our
    losses that take any embedder's output (not the DRML head's), at their
    published defaults; the mean-field losses with ``mf_reg_weight``."""
    table = {}
    for entry in LOSSES.values():
        if entry.origin == "ours" and entry.embedder is None:
            mean_field = issubclass(entry.loss_class, losses.BaseMeanFieldLoss)
            options = {"mf_reg_weight": mf_reg_weight} if mean_field else {}
            table[entry.short_name] = published(entry.name, **options)
    return table


def hyperparameters():
    """{loss: {tuned hyperparameter: value}} of every loss (part of the protocol)."""
    return {name: {entry.tuned: entry.value} for name, entry in LOSSES.items()}

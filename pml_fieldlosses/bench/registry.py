"""The losses the benchmark compares: a table of entries, PML's and ours
(``pml_fieldlosses.losses``, which holds both).

Each entry has one tuned hyperparameter, the one that sets its margin (or
radius, or temperature), with three candidates: the published default (PML's
default for PML's losses, the paper's or official code's for ours) and the
values that halve and double its distance margin. ``pml-fieldlosses select`` trains
every candidate of every loss once, with the same protocol and budget, on the
validation classes (never the test classes) and prints the best; the result
for the default data is ``SELECTED`` below, which the benchmark uses. Every
other hyperparameter keeps its published default.

A name may carry its own value, e.g. ``PFML[delta=0.3]`` (``get_entry``).
Learnable loss parameters (proxies, class weights W, mean fields) get their
own optimiser over ``loss.parameters()`` (BenchConfig.loss_lr_multiplier).
"""

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from pytorch_metric_learning import miners

from .. import losses
from ..models import RelationalEmbedder

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
    # (num_classes, embedding_size, embedder, **{tuned: value}) -> loss module
    make: Callable
    # the tuned hyperparameter, its value and its candidates (the first is the published default)
    tuned: str
    grid: tuple
    value: float = None
    # () -> miner, or None
    miner: Optional[Callable] = None
    # (in_features, embedding_size) -> embedder module, or None for linear_embedder
    embedder: Optional[Callable] = None

    def build(self, num_classes, embedding_size, embedder):
        return self.make(num_classes, embedding_size, embedder, **{self.tuned: self.value})

    def make_embedder(self, in_features, embedding_size):
        return (self.embedder or linear_embedder)(in_features, embedding_size)

    @property
    def default(self):
        return self.grid[0]

    def with_value(self, value):
        return dataclasses.replace(self, value=value)

    def variant(self, value):
        """The name of this loss with its tuned hyperparameter set, e.g. PFML[delta=0.1]."""
        return f"{self.name}[{self.tuned}={value:g}]"

    def candidates(self):
        return [self.variant(v) for v in self.grid]


def _entries():
    branches = 4  # of the DRML head
    # grids: the published default, then the values with half and twice its distance margin
    table = [
        LossEntry(
            "ProxyAnchor",
            "PML",
            lambda C, D, e, margin: losses.ProxyAnchorLoss(C, D, margin=margin),
            "margin",
            (0.1, 0.05, 0.2),
        ),
        LossEntry(  # base is a similarity threshold: distance margin 1 - base = 0.5, 0.25, 1
            "MultiSimilarity",
            "PML",
            lambda C, D, e, base: losses.MultiSimilarityLoss(base=base),
            "base",
            (0.5, 0.75, 0.0),
            miner=lambda: miners.MultiSimilarityMiner(),
        ),
        LossEntry(  # Euclidean on the unit sphere (2: every negative pair but antipodal ones counts)
            "Contrastive",
            "PML",
            lambda C, D, e, neg_margin: losses.ContrastiveLoss(neg_margin=neg_margin),
            "neg_margin",
            (1.0, 0.5, 2.0),
        ),
        LossEntry(
            "CosFace",
            "PML",
            lambda C, D, e, margin: losses.CosFaceLoss(C, D, margin=margin),
            "margin",
            (0.35, 0.175, 0.7),
        ),
        LossEntry(  # degrees
            "ArcFace",
            "PML",
            lambda C, D, e, margin: losses.ArcFaceLoss(C, D, margin=margin),
            "margin",
            (28.6, 14.3, 57.2),
        ),
        LossEntry(
            "NormSoftmax",
            "PML",
            lambda C, D, e, temperature: losses.NormalizedSoftmaxLoss(C, D, temperature=temperature),
            "temperature",
            (0.05, 0.025, 0.1),
        ),
        LossEntry(  # cosine distance
            "MFCont",
            "ours",
            lambda C, D, e, neg_margin: losses.MeanFieldContrastiveLoss(C, D, neg_margin=neg_margin),
            "neg_margin",
            (0.3, 0.15, 0.6),
        ),
        LossEntry(  # similarity threshold: distance margin 1 - base = 0.2, 0.1, 0.4
            "CWMS",
            "ours",
            lambda C, D, e, base: losses.ClassWiseMultiSimilarityLoss(base=base),
            "base",
            (0.8, 0.9, 0.6),
        ),
        LossEntry(
            "MFCWMS",
            "ours",
            lambda C, D, e, base: losses.MeanFieldClassWiseMultiSimilarityLoss(C, D, base=base),
            "base",
            (0.8, 0.9, 0.6),
        ),
        LossEntry(  # radius of both potentials (the paper cross-validates it in [0.1, 0.3])
            "PFML",
            "ours",
            lambda C, D, e, delta: losses.PotentialFieldLoss(C, D, delta=delta),
            "delta",
            (0.2, 0.1, 0.4),
        ),
        LossEntry(
            "CPML",
            "ours",
            lambda C, D, e, delta: losses.ContrastivePotentialLoss(C, D, delta=delta),
            "delta",
            (0.2, 0.1, 0.4),
        ),
        LossEntry(  # the ProxyAnchor margin of the representation and branch losses
            "DRML-ProxyAnchor",
            "ours",
            lambda C, D, e, margin: losses.RelationalLoss(
                e,
                losses.ProxyAnchorLoss(C, D, margin=margin),
                branch_losses=lambda: losses.ProxyAnchorLoss(C, D // branches, margin=margin),
            ),
            "margin",
            (0.1, 0.05, 0.2),
            embedder=lambda F, D: RelationalEmbedder(F, D, num_branches=branches),
        ),
    ]
    return {entry.name: entry.with_value(SELECTED.get(entry.name, entry.default)) for entry in table}


LOSSES = _entries()

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


def hyperparameters():
    """{loss: {tuned hyperparameter: value}} of every loss (part of the protocol)."""
    return {name: {entry.tuned: entry.value} for name, entry in LOSSES.items()}

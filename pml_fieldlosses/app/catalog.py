"""The one table of losses that the bench, the tests and the benchmark scripts
read: PML's losses (``pytorch_metric_learning.losses``) and ours, each from its
declaration (``pml_fieldlosses.losses.declarations``). Import-light: torch, PML and the
library only.

Each entry has one tuned hyperparameter, the one that sets its margin (or
radius, or temperature), with three candidates: the published default (PML's
default for PML's losses, the paper's or official code's for ours) and the
values that halve and double its distance margin. ``pml-fieldlosses select``
trains every candidate of every loss once, with the same protocol and budget,
on the validation classes (never the test classes) and prints the best; the
result for the default data is ``SELECTED`` below, which the benchmark uses.
Every other hyperparameter keeps its published default.

A name may carry its own values, e.g. ``PFML[delta=0.3]`` or
``PFML[alpha=2,proxies_per_class=4]`` (``get_entry``): the tuned hyperparameter
or any keyword the loss's constructor names. ``EXTRA_LOSSES`` are entries that
``pml-fieldlosses claims`` needs but the bench does not run by default.
Learnable loss parameters (proxies, class weights W, mean fields) get their
own optimiser over ``loss.parameters()`` (BenchConfig.loss_lr_multiplier).
``LossEntry`` (one loss of the table) and ``linear_embedder`` live in
``loss_entry`` and are importable from here.
"""

import dataclasses
import math
import re

from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners

from .. import losses
from ..losses.declarations import DECLARATIONS, drml, drml_pair, relational_embedder
from .loss_entry import LossEntry, linear_embedder  # noqa: F401 (catalog.LossEntry, catalog.linear_embedder)

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


def _triplet_miner():
    """Semi-hard triplets within PML's TripletMarginLoss default margin."""
    return miners.TripletMarginMiner(margin=0.05, type_of_triplets="semihard")


# PML's losses, then ours (pml_fieldlosses.losses.declarations, in their order there);
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
    *(LossEntry.declared(declaration) for declaration in DECLARATIONS),
]
LOSSES = {entry.name: entry.with_value(SELECTED.get(entry.name, entry.default)) for entry in _TABLE}

# Entries that only ``pml-fieldlosses claims`` runs (the DRML claim: the head around a
# triplet loss with a miner and around CosFace). Not selected: a DRML variant takes the
# value of the loss it wraps, so that the head is the only difference.
_EXTRA_TABLE = [
    LossEntry(
        "Triplet",
        "PML",
        pml_losses.TripletMarginLoss,
        "margin",
        (0.05, 0.025, 0.1),
        miner=_triplet_miner,
        per_class=False,
    ),
    LossEntry(
        "DRML-Triplet",
        "ours",
        losses.RelationalLoss,
        "margin",
        (0.05, 0.025, 0.1),
        miner=_triplet_miner,
        make=drml_pair(pml_losses.TripletMarginLoss, _triplet_miner),
        embedder=relational_embedder,
    ),
    LossEntry(
        "DRML-CosFace",
        "ours",
        losses.RelationalLoss,
        "margin",
        (0.35, 0.175, 0.7),
        make=drml(pml_losses.CosFaceLoss),
        embedder=relational_embedder,
    ),
]
_WRAPS = {"DRML-CosFace": "CosFace"}
EXTRA_LOSSES = {
    entry.name: entry.with_value(LOSSES[_WRAPS[entry.name]].value if entry.name in _WRAPS else entry.default)
    for entry in _EXTRA_TABLE
}

_VARIANT = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<settings>[^\[\]]+)\]$")
_INTEGER = re.compile(r"^[+-]?\d+$")
# a plain decimal or scientific notation: 2, 0.5, .5, 1e-3 (not nan, inf, 1_0 or 0x1)
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def default_losses():
    return tuple(LOSSES)


def get_entry(name):
    """The entry of ``name``: a loss of LOSSES or EXTRA_LOSSES, or one with
    settings in the name, ``NAME[key=value,...]``: its tuned hyperparameter
    (e.g. ``PFML[delta=0.3]``) or any keyword its constructor names (e.g.
    ``PFML[alpha=2,proxies_per_class=4]``), with a number (an integer when
    written as one)."""
    match = _VARIANT.match(name)
    base = match["name"] if match else name
    known = {**LOSSES, **EXTRA_LOSSES}
    if base not in known:
        raise ValueError(f"unknown loss {name!r}; available: {', '.join(known)}")
    entry = known[base]
    if not match:
        return entry
    settings = {}
    for item in match["settings"].split(","):
        key, _, text = (part.strip() for part in item.partition("="))
        if key not in entry.keywords():
            raise ValueError(
                f"loss {base} takes [{entry.tuned}=VALUE] (its tuned hyperparameter) or [KEY=VALUE,...] "
                f"with KEY one of {', '.join(entry.keywords())}; got {key!r} in {name!r}"
            )
        if key in settings:
            raise ValueError(f"{name!r} sets {key} twice")
        settings[key] = _number(name, key, text)
    value = settings.pop(entry.tuned, entry.value)
    return dataclasses.replace(entry.with_value(value), name=name, options=tuple(settings.items()))


def _number(name, key, text):
    """The number ``text`` of ``key`` in the loss name ``name``: an integer when
    written as one, else a finite float; only plain decimal or scientific notation."""
    if not _NUMBER.match(text):
        raise ValueError(f"{name!r}: {key}={text!r} is not a number (write e.g. 2, 0.5 or 1e-3)")
    value = int(text) if _INTEGER.match(text) else float(text)
    if not math.isfinite(value):
        raise ValueError(f"{name!r}: {key}={text!r} is not a finite number")
    return value


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

"""Each of our losses, declared once.

Everything else is derived from ``DECLARATIONS``: the exports of
``pml_fieldlosses.losses`` and ``ADDED_LOSSES`` (what ``pml_fieldlosses.register()``
adds to PML), the bench's and the claims' loss table (``pml_fieldlosses.app.catalog``),
the loss modules the upstream kit contributes to PML and the test files it copies
(``pml_fieldlosses.app.upstream``), and the tables of the test suite. Adding a loss is
its module, one declaration here, its PML-style test file and its docs section: see
docs/architecture.md, "Adding a loss".
"""

from dataclasses import dataclass
from typing import Callable, Optional

from pytorch_metric_learning import losses as pml_losses

from ..models.relational_embedder import RelationalEmbedder
from .class_wise_multi_similarity_loss import ClassWiseMultiSimilarityLoss
from .contrastive_potential_loss import ContrastivePotentialLoss
from .mean_field_class_wise_multi_similarity_loss import MeanFieldClassWiseMultiSimilarityLoss
from .mean_field_contrastive_loss import MeanFieldContrastiveLoss
from .potential_field_loss import PotentialFieldLoss
from .relational_loss import RelationalLoss

DRML_BRANCHES = 4


@dataclass(frozen=True)
class LossDeclaration:
    loss_class: type
    # its name in the bench's, select's and claims' tables and on their command line
    bench_name: str
    # the hyperparameter that sets its margin (radius, temperature), tuned by
    # `pml-fieldlosses select`, and its candidates: the published default first, then the
    # values that halve and double its distance margin
    tuned: str
    grid: tuple
    # its naive reference, "module.function" of tests/ (explicit loops over samples,
    # classes and pairs), which its PML-style test file tests/losses/test_<module>.py
    # compares with, value and gradients
    reference: str
    # whether the constructor takes (num_classes, embedding_size) first
    per_class: bool = True
    # (num_classes, embedding_size, **options) -> loss, for a loss built otherwise
    make: Optional[Callable] = None
    # (in_features, embedding_size) -> embedder module, None for the bench's linear one
    embedder: Optional[Callable] = None
    # whether the upstream kit contributes it to PML
    upstream: bool = True

    @property
    def module_name(self):
        """The last part of its module's name, e.g. potential_field_loss."""
        return self.loss_class.__module__.rsplit(".", 1)[1]

    @property
    def test_file(self):
        """Its PML-style unittest file, relative to the repository."""
        return f"tests/losses/test_{self.module_name}.py"


def drml(base):
    """``make`` of the DRML relational head around the PML loss class ``base`` (one with
    class parameters sized (num_classes, embedding_size) and a ``margin``); ``margin``:
    that of the representation and branch losses."""

    def make(num_classes, embedding_size, margin):
        def branches():
            return base(num_classes, embedding_size // DRML_BRANCHES, margin=margin)

        return RelationalLoss(
            base(num_classes, embedding_size, margin=margin),
            branch_losses=branches,
            num_branches=DRML_BRANCHES,
            embedding_size=embedding_size,
        )

    return make


def drml_pair(base, miner):
    """``make`` of the DRML head around a pair loss without class parameters (one loss for
    the embedding and every branch), with ``miner()`` for the branches."""

    def make(num_classes, embedding_size, margin):
        return RelationalLoss(
            base(margin=margin),
            num_branches=DRML_BRANCHES,
            embedding_size=embedding_size,
            branch_miner=miner(),
        )

    return make


def relational_embedder(in_features, embedding_size):
    return RelationalEmbedder(in_features, embedding_size, num_branches=DRML_BRANCHES)


DECLARATIONS = [
    # cosine distance
    LossDeclaration(
        MeanFieldContrastiveLoss, "MFCont", "neg_margin", (0.3, 0.15, 0.6), "naive.mean_field_contrastive"
    ),
    # similarity threshold: distance margin 1 - base = 0.2, 0.1, 0.4
    LossDeclaration(
        ClassWiseMultiSimilarityLoss,
        "CWMS",
        "base",
        (0.8, 0.9, 0.6),
        "naive.class_wise_multi_similarity",
        per_class=False,
    ),
    LossDeclaration(
        MeanFieldClassWiseMultiSimilarityLoss,
        "MFCWMS",
        "base",
        (0.8, 0.9, 0.6),
        "naive.mean_field_class_wise_multi_similarity",
    ),
    # radius of both potentials (the paper cross-validates it in [0.1, 0.3])
    LossDeclaration(PotentialFieldLoss, "PFML", "delta", (0.2, 0.1, 0.4), "naive_potential.naive_pfml"),
    LossDeclaration(ContrastivePotentialLoss, "CPML", "delta", (0.2, 0.1, 0.4), "naive_potential.naive_cpml"),
    # the DRML head needs our embedder, which PML has no place for: not contributed
    LossDeclaration(
        RelationalLoss,
        "DRML-ProxyAnchor",
        "margin",
        (0.1, 0.05, 0.2),
        "naive_relational.naive_relational_loss",
        make=drml(pml_losses.ProxyAnchorLoss),
        embedder=relational_embedder,
        upstream=False,
    ),
]

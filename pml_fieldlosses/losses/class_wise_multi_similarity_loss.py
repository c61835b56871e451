import math

import torch
from pytorch_metric_learning.distances import CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..utils import checks
from ..utils.loss_utils import compact_labels, index_counts, log1p_sum_exp
from .mixins import CheckedForwardMixin


# "Mean Field Theory in Deep Metric Learning" (Furusawa, ICLR 2024), Eq. 9;
# official code: st-tech/mft-in-dml, code/loss/classwise_multisimilarity_loss.py
class ClassWiseMultiSimilarityLoss(CheckedForwardMixin, BaseMetricLossFunction):
    """MultiSimilarity made symmetric, with pairs aggregated per class pair.

    With S_ij = cos(x_i, x_j), N_u samples of class u, C_b classes in the batch,
    P_u = 1/N_u^2 sum_{i,j in u} exp(-alpha (S_ij - base))   (i = j included),
    Q_uv = 1/(N_u N_v) sum_{i in u, j in v} exp(beta (S_ij - base)):
    pos_loss = 1/(alpha C_b) sum_u log(1 + P_u / 2),
    neg_loss = 1/(2 beta C_b) sum_{u != v} log(1 + Q_uv).

    Both have one element per query class (indexed by its first sample); the
    default MeanReducer gives the official value.
    With ``ref_emb``/``ref_labels`` (e.g. CrossBatchMemory) i runs over the
    query and j over the reference set, and C_b counts the query classes.
    With a miner, P_u and Q_uv are means over the mined positive / negative
    pairs instead of over all pairs; a class without mined pairs adds 0.
    ``base`` is a similarity threshold (distance margin = 1 - base).
    """

    def __init__(self, alpha=0.01, beta=80, base=0.8, **kwargs):
        super().__init__(**kwargs)
        c_f.assert_distance_type(self, CosineSimilarity)
        check_multi_similarity_hyperparameters(alpha, beta, base)
        self.alpha = alpha
        self.beta = beta
        self.base = base
        self.add_to_recordable_attributes(list_of_names=["alpha", "beta", "base"], is_stat=False)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        sims = self.distance(embeddings, ref_emb)
        all_classes, joint = torch.unique(torch.cat([labels, ref_labels]), return_inverse=True)
        query_class, ref_class = joint[: len(labels)], joint[len(labels) :]
        K = len(all_classes)
        same = query_class.unsqueeze(1) == ref_class.unsqueeze(0)
        groups = query_class.unsqueeze(1) * K + ref_class.unsqueeze(0)
        values = torch.where(same, -self.alpha * (sims - self.base), self.beta * (sims - self.base))

        pairs = self.pair_mask(indices_tuple, labels, ref_labels, sims)
        if pairs is not None:
            values, groups, same = values[pairs], groups[pairs], same[pairs]
        counts = index_counts(groups.reshape(-1), K * K)
        # P_u / 2: log 2 subtracted in the values' dtype (a bool mask times a
        # Python float would round log 2 to float32)
        values = values - torch.log(counts[groups].to(values.dtype)) - math.log(2) * same.to(values.dtype)

        terms = log1p_sum_exp(values.reshape(-1), groups.reshape(-1), K * K).view(K, K)
        query_rows = torch.unique(query_class)
        eye = torch.eye(K, dtype=torch.bool, device=terms.device)
        pos_loss = terms.diagonal()[query_rows] / self.alpha
        neg_loss = terms.masked_fill(eye, 0.0).sum(dim=1)[query_rows] / (2 * self.beta)
        first_sample = compact_labels(labels)[2]
        return {
            "pos_loss": {"losses": pos_loss, "indices": first_sample, "reduction_type": "element"},
            "neg_loss": {"losses": neg_loss, "indices": first_sample, "reduction_type": "element"},
        }

    def pair_mask(self, indices_tuple, labels, ref_labels, sims):
        """None (all pairs) without a miner, else a bool mask of the mined pairs."""
        if indices_tuple is None:
            return None
        a1, p, a2, n = lmu.convert_to_pairs(indices_tuple, labels, ref_labels)
        mask = torch.zeros_like(sims, dtype=torch.bool)
        mask[a1, p] = True
        mask[a2, n] = True
        return mask

    def get_default_distance(self):
        return CosineSimilarity()

    def _sub_loss_names(self):
        return ["pos_loss", "neg_loss"]


def check_multi_similarity_hyperparameters(alpha, beta, base):
    """alpha, beta > 0 and base finite, and neither the exponents alpha (S -
    base), beta (S - base) (|S| <= 1) nor the 1/alpha, 1/beta of the log terms
    beyond float32's range (the exp/log sums are computed shifted, so they
    cannot overflow by themselves)."""
    checks.check_positive("alpha", alpha)
    checks.check_positive("beta", beta)
    checks.check_finite_number("base", base)
    for name, value in (("alpha", alpha), ("beta", beta)):
        checks.check_fits_float32(f"{name} * (1 + |base|), the largest exponent,", value * (1 + abs(base)))
        checks.check_fits_float32(f"log(2) / {name}, the scale of the log terms,", math.log(2) / value)

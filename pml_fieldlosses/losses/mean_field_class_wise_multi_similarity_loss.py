import math

import torch
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..utils import checks
from ..utils.loss_utils import compact_labels, grouped_exp_sums, index_counts, log1p_sum_exp
from .base_mean_field_loss import BaseMeanFieldLoss
from .class_wise_multi_similarity_loss import check_multi_similarity_hyperparameters


# "Mean Field Theory in Deep Metric Learning" (Furusawa, ICLR 2024), Eq. 10;
# official code: st-tech/mft-in-dml, code/loss/mean_field_classwise_multisimilarity_loss.py
class MeanFieldClassWiseMultiSimilarityLoss(BaseMeanFieldLoss):
    """Class-wise MultiSimilarity with each partner replaced by a mean field.

    With S_ic = cos(x_i, mean_fields[c]), N_c samples of class c in the batch,
    C_b classes in the batch and
    P_c = 1/N_c sum_{i: y_i=c} exp(-alpha (S_ic - base)),
    Q_ck = 1/N_c sum_{i: y_i=c} exp(beta (S_ik - base)) (0 if c is absent):
    pos_loss = 1/(alpha C_b) sum_c log(1 + P_c),
    neg_loss = 1/(2 beta C_b) sum_{c != k} log(1 + Q_ck + Q_kc), over all
    num_classes classes: batch samples are also repelled from the mean fields
    of absent classes,
    mf_reg_loss = mf_reg_weight / C * sum_c sum_{k != c} softplus_beta(cos(mean_fields c, k) - base) ** mf_reg_power.

    pos_loss and neg_loss have one element per class in the batch (indexed by
    that class's first sample), so the default MeanReducer gives the official
    value. Time and memory are O(B C D + C_b C): the class-pair sums are
    scattered from the B x C similarities, never multiplied by a one-hot.
    Miner output (``indices_tuple``) becomes per-sample weights
    w_i in [0, 1] that multiply each sample's exp term; without a miner w_i = 1.
    ``base`` is a similarity threshold (the paper's distance margin is 1 - base).
    ``beta=None`` means beta = alpha, as in the official code.
    """

    def __init__(
        self,
        num_classes,
        embedding_size,
        alpha=0.01,
        beta=80,
        base=0.8,
        mf_reg_weight=0.0,
        mf_reg_power=2,
        **kwargs,
    ):
        super().__init__(num_classes, embedding_size, mf_reg_weight, mf_reg_power, **kwargs)
        beta = alpha if beta is None else beta
        check_multi_similarity_hyperparameters(alpha, beta, base)
        # the regulariser's terms t = softplus_beta(G - base), G <= 1, are at most
        # max(1 - base, 0) + log(2) / beta; their derivative mf_reg_power * t ** (mf_reg_power - 1)
        checks.check_fits_float32(
            "the mean-field regulariser, mf_reg_weight * num_classes * mf_reg_power * "
            "(1 - base + log(2) / beta) ** mf_reg_power,",
            lambda: (
                mf_reg_weight
                * num_classes
                * mf_reg_power
                * max(max(1 - base, 0) + math.log(2) / beta, 1) ** mf_reg_power
            ),
        )
        self.alpha = alpha
        self.beta = beta
        self.base = base
        self.add_to_recordable_attributes(list_of_names=["alpha", "beta", "base"], is_stat=False)

    def compute_data_loss(self, embeddings, labels, indices_tuple):
        dtype = embeddings.dtype
        miner_weights = lmu.convert_to_weights(indices_tuple, labels, dtype=dtype)
        sims = self.mean_field_similarities(embeddings)
        classes, batch_class, first_sample = compact_labels(labels)
        num_batch_classes = len(classes)
        counts = index_counts(batch_class, num_batch_classes).to(dtype)
        log_scale = torch.log(miner_weights) - torch.log(counts)[batch_class]

        own_sims = sims.gather(1, labels.unsqueeze(1)).squeeze(1)
        pos_values = -self.alpha * (own_sims - self.base) + log_scale
        pos_loss = log1p_sum_exp(pos_values, batch_class, num_batch_classes) / self.alpha

        neg_values = self.beta * (sims - self.base) + log_scale.unsqueeze(1)
        shift, sums = grouped_exp_sums(neg_values, batch_class, num_batch_classes)
        # a mask, not index_fill: torch.compile's inductor (2.13, CPU) wrote the backward of an
        # index_fill followed by a sum into the summed gradient, zeroing the absent classes' gradient
        present = torch.zeros(self.num_classes, dtype=torch.bool, device=labels.device).index_fill(
            0, classes, True
        )
        to_absent = torch.where(present, 0.0, shift + torch.log(torch.exp(-shift) + sums))
        in_batch = self.in_batch_pair_terms(shift, sums, classes)
        neg_loss = (in_batch.sum(dim=1) + 2 * to_absent.sum(dim=1)) / (2 * self.beta)

        return {
            "pos_loss": {"losses": pos_loss, "indices": first_sample, "reduction_type": "element"},
            "neg_loss": {"losses": neg_loss, "indices": first_sample, "reduction_type": "element"},
        }

    def in_batch_pair_terms(self, shift, sums, classes):
        """log(1 + Q_ab + Q_ba) for two batch classes a != b (0 on the diagonal), C_b x C_b
        in the order of the batch classes, from Q_ak = exp(shift_ak) * sums_ak (C_b x C:
        rows the batch classes, columns all classes; ``classes`` the batch classes' labels).

        Q_ab and Q_ba are two gathers indexing both dimensions, not x[:, classes] and its
        transpose: torch.compile's inductor (2.13, CPU) mis-strided the backward of those and
        wrote past its buffer."""
        rows = torch.arange(len(classes), device=classes.device)
        ab = (rows.unsqueeze(1), classes.unsqueeze(0))  # entry [a, b] is (a, classes[b])
        ba = (rows.unsqueeze(0), classes.unsqueeze(1))  # entry [a, b] is (b, classes[a])
        shift_ab, shift_ba = shift[ab], shift[ba]
        top = torch.maximum(shift_ab, shift_ba)
        total = torch.exp(-top) + torch.exp(shift_ab - top) * sums[ab] + torch.exp(shift_ba - top) * sums[ba]
        terms = top + torch.log(total)
        return terms.masked_fill(torch.eye(len(terms), dtype=torch.bool, device=terms.device), 0.0)

    def regularizer_terms(self, similarities):
        return torch.nn.functional.softplus(similarities - self.base, beta=self.beta)

import torch
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..utils import checks
from ..utils.loss_utils import compact_labels, log1p_sum_exp
from .base_mean_field_loss import BaseMeanFieldLoss


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
    value. Miner output (``indices_tuple``) becomes per-sample weights
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
        checks.check_positive("alpha", alpha)
        checks.check_positive("beta", beta)
        self.alpha = alpha
        self.beta = beta
        self.base = base
        self.add_to_recordable_attributes(list_of_names=["alpha", "beta", "base"], is_stat=False)

    def compute_data_loss(self, embeddings, labels, indices_tuple):
        dtype = embeddings.dtype
        miner_weights = lmu.convert_to_weights(indices_tuple, labels, dtype=dtype)
        sims = self.distance(embeddings, self.mean_fields)
        classes, batch_class, first_sample = compact_labels(labels)
        num_batch_classes, C = len(classes), self.num_classes
        counts = torch.bincount(batch_class, minlength=num_batch_classes).to(dtype)
        log_scale = torch.log(miner_weights) - torch.log(counts)[batch_class]

        own_sims = sims.gather(1, labels.unsqueeze(1)).squeeze(1)
        pos_values = -self.alpha * (own_sims - self.base) + log_scale
        pos_loss = log1p_sum_exp(pos_values, batch_class, num_batch_classes) / self.alpha

        neg_values = self.beta * (sims - self.base) + log_scale.unsqueeze(1)
        pair_terms = log1p_sum_exp(
            neg_values, self.class_pair_groups(classes, batch_class), num_batch_classes * C + 1
        )[:-1].view(num_batch_classes, C)
        in_batch = pair_terms[:, classes]
        to_absent = pair_terms.index_fill(1, classes, 0.0)
        neg_loss = ((in_batch + in_batch.t()).sum(dim=1) + 2 * to_absent.sum(dim=1)) / (2 * self.beta)

        return {
            "pos_loss": {"losses": pos_loss, "indices": first_sample, "reduction_type": "element"},
            "neg_loss": {"losses": neg_loss, "indices": first_sample, "reduction_type": "element"},
        }

    def class_pair_groups(self, classes, batch_class):
        """Group id of each (sample i, class k) term of neg_loss: the unordered
        pair {y_i, k}, so that Q_ck and Q_kc land in one log(1 + ...). The pair
        is stored at (batch-class row, class column) = num_batch_classes x C;
        for two batch classes, at the row of the smaller one. Terms with
        k = y_i go to one extra, discarded group."""
        num_batch_classes, C = len(classes), self.num_classes
        columns = torch.arange(C, device=classes.device)
        groups = batch_class.unsqueeze(1) * C + columns
        row = batch_class.unsqueeze(1)
        col = torch.arange(num_batch_classes, device=classes.device)
        in_batch = torch.where(col < row, col * C + classes[row], row * C + classes[col])
        groups[:, classes] = torch.where(col == row, num_batch_classes * C, in_batch)
        return groups

    def regularizer_terms(self, similarities):
        return torch.nn.functional.softplus(similarities - self.base, beta=self.beta)

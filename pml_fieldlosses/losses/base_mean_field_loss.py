import math

import torch
from pytorch_metric_learning.distances import BaseDistance, CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction, WeightRegularizerMixin
from pytorch_metric_learning.utils import common_functions as c_f
from torch.utils.checkpoint import checkpoint

from ..utils import checks
from ..utils.loss_utils import scale_rows_for_normalize
from .mixins import CheckedForwardMixin


class _NormalizeScaledRows(torch.autograd.Function):
    """normalize(scale_rows_for_normalize(x)) of a (C, D) matrix, as torch's normalize (p = 2,
    eps) computes it: the same values and gradients, bit for bit (a zero entry of the gradient
    may differ in sign). Autograd's chain of these ops makes nine (C, D) temporaries (the |x|
    of the row scaling, the scaled rows, the division and their backward); here the forward
    makes one and the backward two, with the same operations in the same order, hence the
    same rounding. A second derivative (create_graph=True) differentiates autograd's chain."""

    @staticmethod
    def forward(ctx, x, eps):
        scale = _row_scale(x)
        normalized = x * scale
        norm = normalized.norm(2, 1, True)
        clamped = norm.clamp_min(eps)
        normalized.div_(clamped)
        ctx.save_for_backward(x, scale, normalized, norm, clamped)
        ctx.eps = eps
        return normalized

    @staticmethod
    def backward(ctx, grad):
        x, scale, normalized, norm, clamped = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: a graph of the first derivative is wanted
            with torch.enable_grad():
                chain = torch.nn.functional.normalize(x * scale, p=2, dim=1, eps=ctx.eps)
            return torch.autograd.grad(chain, x, grad, create_graph=True)[0], None
        # autograd's steps: the division's gradient w.r.t. its denominator,
        # -grad * ((y / n) / n) summed over the row (y = x * scale, y / n = normalized) ...
        temp = normalized / clamped
        temp.mul_(grad)
        grad_norm = torch.where(norm >= ctx.eps, -temp.sum(dim=1, keepdim=True), 0.0)
        # ... the norm's, grad_norm * (y / ||y||), 0 on zero rows (y is 0 there: dividing
        # by 1 gives the 0 the masked NaN becomes) ...
        torch.mul(x, scale, out=temp)
        temp.div_(norm.masked_fill(norm == 0, 1.0)).mul_(grad_norm)
        # ... added to the division's gradient w.r.t. its numerator, grad / n, times the scale
        result = grad / clamped
        return result.add_(temp).mul_(scale), None


def _row_scale(x):
    """The factor scale_rows_for_normalize multiplies x by (a power of two per row, 1 on rows
    below its threshold), from the row's largest and smallest entry: its largest |entry|
    without an |x| temporary (torch's aminmax is slower on CPU than the two reductions)."""
    max_exponent = math.frexp(torch.finfo(x.dtype).max)[1]
    threshold = 2.0 ** (max_exponent // 2 - 10)
    x = x.detach()
    largest = torch.maximum(x.amax(dim=1, keepdim=True), -x.amin(dim=1, keepdim=True))
    exponent = torch.frexp(largest).exponent.to(x.dtype)
    exponent = exponent.masked_fill(largest < threshold, 0.0)
    return torch.pow(x.new_tensor(2.0), -exponent)


# Shared part of the losses of "Mean Field Theory in Deep Metric Learning"
# (Furusawa, ICLR 2024), https://github.com/st-tech/mft-in-dml
class BaseMeanFieldLoss(CheckedForwardMixin, WeightRegularizerMixin, BaseMetricLossFunction):
    """Holds the learnable mean fields and the chunked mean-field regulariser.

    ``mean_fields`` has shape (num_classes, embedding_size): row c is the raw
    mean field of class c (the official code stores the transpose). Rows are
    L2-normalised on every use and never renormalised in place.
    Subclasses implement ``compute_data_loss`` and ``regularizer_terms``.
    """

    # entries of one (rows x num_classes) block of the regulariser
    reg_chunk_entries = 2**22

    def __init__(self, num_classes, embedding_size, mf_reg_weight=0.0, mf_reg_power=2, **kwargs):
        super().__init__(**kwargs)
        c_f.assert_distance_type(self, CosineSimilarity)
        checks.check_positive_int("num_classes", num_classes)
        checks.check_positive_int("embedding_size", embedding_size)
        checks.check_non_negative("mf_reg_weight", mf_reg_weight)
        # the regulariser's terms are 0 on most pairs, where x**p with p < 1
        # has an infinite derivative
        checks.check_finite_number("mf_reg_power", mf_reg_power, low=1)
        self.num_classes = num_classes
        self.embedding_size = embedding_size
        self.mf_reg_weight = mf_reg_weight
        self.mf_reg_power = mf_reg_power
        self.mean_fields = torch.nn.Parameter(torch.Tensor(num_classes, embedding_size))
        self.weight_init_func(self.mean_fields)
        self.add_to_recordable_attributes(
            list_of_names=["num_classes", "embedding_size", "mf_reg_weight", "mf_reg_power"],
            is_stat=False,
        )

    def cast_types(self, dtype, device):
        # never below float32: half-precision inputs were upcast by CheckedForwardMixin; outside
        # inference mode, so that a cast under torch.inference_mode() leaves an ordinary parameter
        with torch.inference_mode(False):
            self.mean_fields.data = c_f.to_device(self.mean_fields.data, device=device, dtype=dtype)

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        checks.ref_not_supported(self, embeddings, labels, ref_emb, ref_labels)
        self.cast_types(embeddings.dtype, embeddings.device)
        checks.check_finite(self.mean_fields, f"{type(self).__name__}.mean_fields")
        loss_dict = self.compute_data_loss(embeddings, labels, indices_tuple)
        loss_dict["mf_reg_loss"] = self.mean_field_regularization()
        self.add_weight_regularization_to_loss_dict(loss_dict, self.mean_fields)
        return loss_dict

    def mean_field_regularization(self):
        """mf_reg_weight * (1/C) sum_c sum_{k != c} regularizer_terms(G_ck) ** mf_reg_power
        with G = mean_fields @ mean_fields.T. G is symmetric, so only the blocks
        above the diagonal are computed (twice the sum over k > c), in row
        blocks that are recomputed in the backward pass (activation
        checkpointing): memory O(reg_chunk_entries + C D) instead of O(C^2)."""
        if self.mf_reg_weight == 0:
            return self.zero_loss()
        mean_fields = self.normalized_mean_fields()
        C = self.num_classes
        rows = max(1, self.reg_chunk_entries // C)
        total = 0
        for start in range(0, C, rows):
            block, tail = mean_fields[start : start + rows], mean_fields[start:]
            if torch.is_grad_enabled() and mean_fields.requires_grad:
                total = total + checkpoint(self._regularizer_block, block, tail, use_reentrant=False)
            else:
                total = total + self._regularizer_block(block, tail)
        loss = self.mf_reg_weight * 2 * total / C
        return {"losses": loss, "indices": None, "reduction_type": "already_reduced"}

    def _regularizer_block(self, block, tail):
        """Sum over the pairs (start + i, start + j), j > i, of the terms; block
        = rows start.. of the mean fields, tail = rows start..C-1."""
        terms = self.regularizer_terms(self.distance.compute_mat(block, tail)) ** self.mf_reg_power
        return torch.triu(terms, diagonal=1).sum()

    def normalizable_mean_fields(self):
        """The mean fields, rows that would overflow ||row|| divided by a power of
        two (exact, see scale_rows_for_normalize; as the embeddings)."""
        return scale_rows_for_normalize(self.mean_fields)

    def normalized_mean_fields(self):
        """self.distance.normalize(self.normalizable_mean_fields()): the same values and
        gradients. On CPU, where the passes over the (C, D) parameter dominate a step, in
        fewer passes (_NormalizeScaledRows) when the distance normalises as PML's
        BaseDistance does (p = 2); on a GPU the step is bound by kernel launches, which
        autograd's chain issues with less Python overhead."""
        if self.mean_fields.device.type != "cpu" or not self._plain_normalization():
            return self.distance.normalize(self.normalizable_mean_fields())
        return _NormalizeScaledRows.apply(self.mean_fields, 1e-12)  # torch's normalize's eps

    def mean_field_similarities(self, embeddings):
        """self.distance(embeddings, self.normalizable_mean_fields()), B x C: the
        distance's steps (stats, compute_mat, power) with the mean fields normalised by
        normalized_mean_fields. A distance that overrides forward is called as it is."""
        distance = self.distance
        if type(distance).forward is not BaseDistance.forward or not self._plain_normalization():
            return distance(embeddings, self.normalizable_mean_fields())
        distance.reset_stats()
        distance.check_shapes(embeddings, self.mean_fields)
        query, ref = distance.normalize(embeddings), self.normalized_mean_fields()
        if distance.collect_stats:
            distance.set_default_stats(embeddings, self.normalizable_mean_fields(), query, ref)
        mat = distance.compute_mat(query, ref)
        return mat if distance.power == 1 else mat**distance.power

    def _plain_normalization(self):
        distance = self.distance
        return (
            distance.normalize_embeddings
            and distance.p == 2
            and type(distance).normalize is BaseDistance.normalize
        )

    def compute_data_loss(self, embeddings, labels, indices_tuple):
        raise NotImplementedError

    def regularizer_terms(self, similarities):
        raise NotImplementedError

    def get_default_distance(self):
        return CosineSimilarity()

    def _sub_loss_names(self):
        return ["pos_loss", "neg_loss", "mf_reg_loss"]

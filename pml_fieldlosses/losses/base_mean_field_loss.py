import torch
from pytorch_metric_learning.distances import BaseDistance, CosineSimilarity
from pytorch_metric_learning.losses import BaseMetricLossFunction, WeightRegularizerMixin
from pytorch_metric_learning.utils import common_functions as c_f
from torch.utils.checkpoint import checkpoint

from ..utils import checks
from ..utils.loss_utils import NormalizedRows, scale_rows_for_normalize
from .mixins import CheckedForwardMixin


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
        fewer passes (NormalizedRows) when the distance normalises as PML's
        BaseDistance does (p = 2); on a GPU the step is bound by kernel launches, which
        autograd's chain issues with less Python overhead."""
        if self.mean_fields.device.type != "cpu" or not self._plain_normalization():
            return self.distance.normalize(self.normalizable_mean_fields())
        return NormalizedRows.apply(self.mean_fields, 1e-12)  # torch's normalize's eps

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

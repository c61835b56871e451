import torch
from pytorch_metric_learning.utils import common_functions as c_f
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from ..utils import checks
from .base_mean_field_loss import BaseMeanFieldLoss


# "Mean Field Theory in Deep Metric Learning" (Furusawa, ICLR 2024), Eq. 8;
# official code: st-tech/mft-in-dml, code/loss/mean_field_contrastive_loss.py
class MeanFieldContrastiveLoss(BaseMeanFieldLoss):
    """Contrastive loss with each partner replaced by its class's mean field.

    With D_ic = 1 - cos(x_i, mean_fields[c]) (cosine distance):
    pos_loss_i = [D_{i,y_i} - pos_margin]_+,
    neg_loss_i = sum_{c != y_i} [neg_margin - D_ic]_+ over all num_classes
    classes (also those absent from the batch),
    mf_reg_loss = mf_reg_weight / C * sum_c sum_{k != c} [neg_margin - D(mean_fields c, k)]_+ ** mf_reg_power.
    With the default MeanReducer the total equals the official value.
    mf_reg_weight defaults to 0: the official code has no default, its README
    uses 0 and the paper finds no significant effect of it.
    """

    def __init__(
        self,
        num_classes,
        embedding_size,
        pos_margin=0.02,
        neg_margin=0.3,
        mf_reg_weight=0.0,
        mf_reg_power=2,
        **kwargs,
    ):
        super().__init__(num_classes, embedding_size, mf_reg_weight, mf_reg_power, **kwargs)
        checks.check_finite_number("pos_margin", pos_margin)
        checks.check_finite_number("neg_margin", neg_margin)
        # [D - pos_margin]_+ <= 2 - pos_margin (and the batch's sum of B such terms)
        checks.check_fits_float32("the positive term, 2 - pos_margin,", 2 - min(pos_margin, 0))
        # cosine distances are in [0, 2]: [neg_margin - D]_+ <= max(neg_margin, 0)
        checks.check_fits_float32(
            "the negative sum over classes, num_classes * neg_margin,", num_classes * max(neg_margin, 0)
        )
        # the regulariser's terms t = [neg_margin - D]_+ <= max(neg_margin, 0) and
        # their derivative mf_reg_power * t ** (mf_reg_power - 1)
        checks.check_fits_float32(
            "the mean-field regulariser, mf_reg_weight * num_classes * mf_reg_power * neg_margin ** mf_reg_power,",
            lambda: mf_reg_weight * num_classes * mf_reg_power * max(neg_margin, 1) ** mf_reg_power,
        )
        self.pos_margin = pos_margin
        self.neg_margin = neg_margin
        self.add_to_recordable_attributes(list_of_names=["pos_margin", "neg_margin"], is_stat=False)

    def compute_data_loss(self, embeddings, labels, indices_tuple):
        miner_weights = lmu.convert_to_weights(indices_tuple, labels, dtype=embeddings.dtype)
        distances = 1 - self.mean_field_similarities(embeddings)
        own_class = labels.unsqueeze(1)
        pos_loss = torch.relu(distances.gather(1, own_class).squeeze(1) - self.pos_margin)
        neg_loss = torch.relu(self.neg_margin - distances).scatter(1, own_class, 0.0).sum(dim=1)
        indices = c_f.torch_arange_from_size(embeddings)
        return {
            "pos_loss": {"losses": pos_loss * miner_weights, "indices": indices, "reduction_type": "element"},
            "neg_loss": {"losses": neg_loss * miner_weights, "indices": indices, "reduction_type": "element"},
        }

    def regularizer_terms(self, similarities):
        return torch.relu(self.neg_margin - (1 - similarities))

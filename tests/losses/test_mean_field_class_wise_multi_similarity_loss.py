import unittest

from pml_fieldlosses.losses import MeanFieldClassWiseMultiSimilarityLoss

from ..naive import mean_field_class_wise_multi_similarity
from .exactness import TORCH_VERSION, C, D, check_value_and_gradients


def make_loss():
    """A cubic regulariser (mf_reg_power=3) besides the multi-similarity terms."""
    return MeanFieldClassWiseMultiSimilarityLoss(
        C, D, alpha=2.0, beta=10.0, base=0.5, mf_reg_weight=0.3, mf_reg_power=3
    )


def reference(x, y, W):
    return mean_field_class_wise_multi_similarity(x, y, W, 2.0, 10.0, 0.5, 0.3, 3)


@unittest.skipIf(TORCH_VERSION < (2, 0), "needs torch >= 2.0 (Tensor.scatter_reduce)")
class TestMeanFieldClassWiseMultiSimilarityLoss(unittest.TestCase):
    def test_mean_field_class_wise_multi_similarity(self):
        check_value_and_gradients(self, make_loss, reference, parameter="mean_fields", shape=(C, D))


if __name__ == "__main__":
    unittest.main()

import unittest

from pml_fieldlosses.losses import MeanFieldContrastiveLoss

from ..naive import mean_field_contrastive
from .exactness import TORCH_VERSION, C, D, check_value_and_gradients


@unittest.skipIf(TORCH_VERSION < (2, 0), "needs torch >= 2.0 (Tensor.scatter_reduce)")
class TestMeanFieldContrastiveLoss(unittest.TestCase):
    def test_mean_field_contrastive(self):
        # margins and a regulariser weight that make every term matter at this scale
        check_value_and_gradients(
            self,
            lambda: MeanFieldContrastiveLoss(C, D, pos_margin=0.1, neg_margin=0.9, mf_reg_weight=0.5),
            lambda x, y, W: mean_field_contrastive(x, y, W, 0.1, 0.9, 0.5, 2),
            parameter="mean_fields",
            shape=(C, D),
        )


if __name__ == "__main__":
    unittest.main()

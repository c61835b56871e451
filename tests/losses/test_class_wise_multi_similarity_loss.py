import unittest

from pml_fieldlosses.losses import ClassWiseMultiSimilarityLoss

from ..naive import class_wise_multi_similarity
from .exactness import TORCH_VERSION, check_value_and_gradients


@unittest.skipIf(TORCH_VERSION < (2, 0), "needs torch >= 2.0 (Tensor.scatter_reduce)")
class TestClassWiseMultiSimilarityLoss(unittest.TestCase):
    def test_class_wise_multi_similarity(self):
        # no learnable parameter; alpha, beta and base chosen so that both sides of the margin count
        check_value_and_gradients(
            self,
            lambda: ClassWiseMultiSimilarityLoss(alpha=2.0, beta=10.0, base=0.5),
            lambda x, y, W: class_wise_multi_similarity(x, y, 2.0, 10.0, 0.5),
        )


if __name__ == "__main__":
    unittest.main()

import unittest

from pml_fieldlosses.losses import PotentialFieldLoss

from ..naive_potential import naive_pfml
from .exactness import TORCH_VERSION, C, D, check_value_and_gradients


@unittest.skipIf(TORCH_VERSION < (2, 0), "needs torch >= 2.0 (Tensor.scatter_reduce)")
class TestPotentialFieldLoss(unittest.TestCase):
    def test_potential_field(self):
        # dense=False: at this size the loss would take its dense path (the paper's sum as
        # written); the scalable path is the one that needs the naive reference
        check_value_and_gradients(
            self,
            lambda: PotentialFieldLoss(C, D, proxies_per_class=2, delta=0.8, alpha=2.0, dense=False),
            lambda x, y, W: sum(naive_pfml(x, y, W, 0.8, 2.0)),
            parameter="proxies",
            shape=(C, 2, D),
        )


if __name__ == "__main__":
    unittest.main()

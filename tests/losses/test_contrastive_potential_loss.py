import unittest

from pml_fieldlosses.losses import ContrastivePotentialLoss

from ..naive_potential import naive_cpml
from .exactness import TORCH_VERSION, C, D, check_value_and_gradients

M = 2  # proxies per class


def make_loss():
    """The scalable path (dense=False), with a repulsion radius larger than the attraction's."""
    return ContrastivePotentialLoss(C, D, proxies_per_class=M, delta=0.6, repulsion_delta=1.2, dense=False)


@unittest.skipIf(TORCH_VERSION < (2, 0), "needs torch >= 2.0 (Tensor.scatter_reduce)")
class TestContrastivePotentialLoss(unittest.TestCase):
    def test_contrastive_potential(self):
        check_value_and_gradients(
            self,
            make_loss,
            lambda x, y, W: sum(naive_cpml(x, y, W, 0.6, 1.2)),
            parameter="proxies",
            shape=(C, M, D),
        )


if __name__ == "__main__":
    unittest.main()

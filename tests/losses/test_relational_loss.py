import unittest

import torch
from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_fieldlosses.losses import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder, branch_outputs_of

from .. import TEST_DEVICE, TEST_DTYPES
from ..naive_relational import naive_relational_loss
from .exactness import C, assert_close

IN_FEATURES, EMBEDDING_SIZE, K = 12, 9, 3
LABELS = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 0, 1, 8]


class TestRelationalLoss(unittest.TestCase):
    def test_relational(self):
        """The DRML head's outputs through RelationalLoss around ProxyAnchor: value and
        gradients (features, the head's and the losses' parameters) against the loop-built
        composition, in float32 and float64 (half precision trains under autocast)."""
        generator = torch.Generator().manual_seed(0)
        for dtype in [d for d in TEST_DTYPES if d in (torch.float32, torch.float64)]:
            torch.manual_seed(0)
            embedder = RelationalEmbedder(IN_FEATURES, EMBEDDING_SIZE, K)
            with torch.no_grad():  # away from the initial [I | 0] integrator, so every path matters
                embedder.integrator.weight.add_(0.3 * torch.randn_like(embedder.integrator.weight))
            loss_func = RelationalLoss(
                ProxyAnchorLoss(C, EMBEDDING_SIZE, margin=0.2, alpha=8),
                branch_losses=lambda: ProxyAnchorLoss(C, EMBEDDING_SIZE // K, margin=0.2, alpha=8),
                num_branches=K,
                embedding_size=EMBEDDING_SIZE,
                representation_weight=10.0,
            )
            embedder, loss_func = embedder.to(TEST_DEVICE, dtype), loss_func.to(TEST_DEVICE, dtype)
            features = torch.randn(len(LABELS), IN_FEATURES, generator=generator, dtype=torch.float64)
            features = features.to(TEST_DEVICE, dtype).requires_grad_()
            labels = torch.tensor(LABELS, device=TEST_DEVICE)
            inputs = [features, *embedder.parameters(), *loss_func.parameters()]

            loss = loss_func(embedder(features), labels)
            grads = torch.autograd.grad(loss, inputs, allow_unused=True)
            embeddings = embedder(features)
            nodes, errors, _ = branch_outputs_of(embeddings)
            expected = naive_relational_loss(loss_func, embeddings, nodes, errors, labels)
            expected_grads = torch.autograd.grad(expected, inputs, allow_unused=True)

            assert_close(self, loss, expected, dtype)
            for grad, expected_grad in zip(grads, expected_grads):
                self.assertEqual(grad is None, expected_grad is None)
                if grad is not None:
                    assert_close(self, grad, expected_grad, dtype)


if __name__ == "__main__":
    unittest.main()

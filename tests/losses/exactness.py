"""The check of our PML-style loss tests: the loss's value and its gradients (embeddings
and its learnable parameter) against a naive reference in float64, in every dtype of
TEST_DTYPES on TEST_DEVICE, on batches with absent classes, a singleton class, one class
and one sample. The upstream kit copies what a test file uses of this module into it."""

import torch

from .. import TEST_DEVICE, TEST_DTYPES
from ..helpers import TOLERANCES
LABELS = [
    [0, 0, 2, 2, 2, 5, 5, 1],  # absent classes
    [0, 0, 1, 1, 4, 3, 3, 3],  # a singleton class
    [6, 6, 6, 6, 6],  # one class
    [3],  # one sample
]
C, D = 9, 6
TORCH_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def assert_close(test, actual, expected, dtype):
    """In float64; atol grows with the largest expected entry."""
    rtol, atol = TOLERANCES[dtype]["rtol"], TOLERANCES[dtype]["atol"]
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    atol = atol + rtol * expected.abs().max().item()
    test.assertTrue(torch.allclose(actual, expected, rtol=rtol, atol=atol), (actual, expected))


def check_value_and_gradients(test, make_loss, reference, parameter=None, shape=None):
    """``make_loss()``: the loss; ``reference(x, y, W)``: the naive loss of float64
    embeddings x (B, D), labels y (a list) and the learnable parameter W (float64, of
    ``shape``, set as the loss's attribute ``parameter``; None without one)."""
    generator = torch.Generator().manual_seed(0)
    for dtype in TEST_DTYPES:
        for y in LABELS:
            x = torch.randn(len(y), D, generator=generator, dtype=torch.float64) * 3
            x = x.to(dtype)
            loss_func = make_loss().to(TEST_DEVICE)
            inputs = [x.to(TEST_DEVICE).requires_grad_()]
            W = None
            if parameter is not None:
                # the learnable parameter, never below float32
                W = torch.randn(shape, generator=generator, dtype=torch.float64)
                learnable = getattr(loss_func, parameter)
                learnable.data = W.to(TEST_DEVICE, torch.promote_types(dtype, torch.float32))
                inputs.append(learnable)
            loss = loss_func(inputs[0], torch.tensor(y, device=TEST_DEVICE))
            grads = torch.autograd.grad(loss, inputs)

            x64 = x.double().requires_grad_()
            expected_inputs = [x64]
            if W is not None:
                W = W.requires_grad_()
                expected_inputs.append(W)
            expected = reference(x64, y, W)
            expected_grads = torch.autograd.grad(expected, expected_inputs)
            assert_close(test, loss, expected, dtype)
            for grad, expected_grad in zip(grads, expected_grads):
                assert_close(test, grad, expected_grad, dtype)

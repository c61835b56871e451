import os

import pytest
import torch

from .helpers import DEVICE, DTYPES
from .loss_registry import ALL_LOSSES

# cuBLAS needs this for deterministic algorithms (read when its first handle is made)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ALL_LOSSES)
def test_identical_results_twice_under_deterministic_algorithms(name, dtype, deterministic):
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        loss_func = ALL_LOSSES[name](20, 16).to(DEVICE)
        x = torch.randn(40, 16).to(DEVICE, dtype).requires_grad_()
        labels = torch.randint(0, 12, (40,)).to(DEVICE)
        loss = loss_func(x, labels)
        loss.backward()
        results.append([loss.detach(), x.grad] + [p.grad for p in loss_func.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)

import pytest
import torch


@pytest.fixture(autouse=True)
def same_global_random_state():
    """Every test starts from the same global torch random state, whatever ran before it: a
    loss's initial proxies or a test module's weights come from it, and a test whose outcome
    depended on them would otherwise pass or fail with the tests run before it (their order
    and number, a parametrisation)."""
    torch.manual_seed(0)

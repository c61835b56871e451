"""Property-based tests: every call returns a finite loss with finite gradients,
or raises one of our documented errors (ValueError/TypeError with a message)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .loss_registry import ALL_LOSSES

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@st.composite
def batches(draw):
    num_classes = draw(st.integers(1, 12))
    embedding_size = draw(st.integers(1, 16))
    batch_size = draw(st.integers(1, 24))
    pattern = draw(st.sampled_from(["random", "one_class", "all_distinct", "few_classes"]))
    if pattern == "one_class":
        labels = [draw(st.integers(0, num_classes - 1))] * batch_size
    elif pattern == "all_distinct":
        batch_size = min(batch_size, num_classes)
        labels = draw(st.permutations(range(num_classes)))[:batch_size]
    else:
        high = num_classes - 1 if pattern == "random" else min(num_classes - 1, 1)
        labels = draw(st.lists(st.integers(0, high), min_size=batch_size, max_size=batch_size))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]))
    scale = draw(st.sampled_from([1e-30, 1e-6, 1e-3, 1.0, 1e3, 1e6]))
    special = draw(
        st.sampled_from(["none", "zeros", "duplicates", "nan", "inf", "bad_label", "float_labels"])
    )
    seed = draw(st.integers(0, 2**31 - 1))
    return num_classes, embedding_size, labels, dtype, scale, special, seed


def make_inputs(num_classes, embedding_size, labels, dtype, scale, special, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(labels), embedding_size, generator=g, dtype=torch.float64) * scale
    y = torch.tensor(labels)
    if special == "zeros":
        x[0] = 0
    elif special == "duplicates":
        x[:] = x[0].clone()
    elif special == "nan":
        x[-1, 0] = float("nan")
    elif special == "inf":
        x[0, -1] = float("inf")
    elif special == "bad_label":
        y[0] = num_classes + 3
    elif special == "float_labels":
        y = y.float()
    return x.to(dtype).requires_grad_(), y


def check_call(name, case):
    num_classes, embedding_size = case[0], case[1]
    loss_func = ALL_LOSSES[name](num_classes, embedding_size)
    x, y = make_inputs(*case)
    try:
        loss = loss_func(x, y)
    except (ValueError, TypeError) as error:
        assert case[5] in ("nan", "inf", "bad_label", "float_labels"), f"unexpected refusal: {error}"
        assert str(error)
        return
    special = case[5]
    assert special in ("none", "zeros", "duplicates") or (
        special == "bad_label" and not hasattr(loss_func, "num_classes")
    ), f"{special} input was accepted"
    loss.backward()
    assert torch.isfinite(loss), loss
    assert torch.isfinite(x.grad.float()).all()
    for p in loss_func.parameters():
        assert torch.isfinite(p.grad).all()
        assert p.dtype in (torch.float32, torch.float64)


@pytest.mark.parametrize("name", ALL_LOSSES)
@settings(max_examples=60, **SETTINGS)
@given(case=batches())
def test_fuzz_finite_or_documented_error(name, case):
    check_call(name, case)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_LOSSES)
@settings(max_examples=3000, **SETTINGS)
@given(case=batches())
def test_fuzz_finite_or_documented_error_long(name, case):
    check_call(name, case)

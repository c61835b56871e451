"""Property-based tests: every call returns a finite loss with finite gradients,
or raises one of our documented errors (ValueError/TypeError with a message).

Input classes drawn: label patterns; embedding dtypes; scales from denormal
(1e-40, 1e-310) through tiny norms to huge finite values (1e19, 1e150; a scale
beyond the dtype's range casts to inf and must be refused); zero rows,
duplicates, NaN/inf, out-of-range or float labels; labels of every integer
dtype. Hyperparameters: every numeric constructor argument of every loss set
to NaN/inf/0/negative/tiny/huge values must be refused at construction with
an error naming it, or give a finite loss and gradients."""

import inspect
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import assert_input_gradient_finite
from .loss_registry import ALL_LOSSES

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


# every integer dtype torch has (uint16/32/64 since torch 2.3)
LABEL_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8] + [
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
]


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
    scale = draw(st.sampled_from([1e-310, 1e-40, 1e-30, 1e-6, 1e-3, 1.0, 1e3, 1e6, 1e19, 1e150]))
    label_dtype = draw(st.sampled_from(LABEL_DTYPES))
    special = draw(
        st.sampled_from(["none", "zeros", "duplicates", "nan", "inf", "bad_label", "float_labels"])
    )
    seed = draw(st.integers(0, 2**31 - 1))
    return num_classes, embedding_size, labels, dtype, scale, special, seed, label_dtype


def make_inputs(num_classes, embedding_size, labels, dtype, scale, special, seed, label_dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(labels), embedding_size, generator=g, dtype=torch.float64) * scale
    y = torch.tensor(labels, dtype=label_dtype)
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
    # a scale beyond the dtype's range casts to inf, which must be refused
    special = case[5] if torch.isfinite(x).all() or case[5] == "nan" else "inf"
    try:
        loss = loss_func(x, y)
    except (ValueError, TypeError) as error:
        assert special in ("nan", "inf", "bad_label", "float_labels"), f"unexpected refusal: {error}"
        assert str(error)
        return
    assert special in ("none", "zeros", "duplicates") or (
        special == "bad_label" and not hasattr(loss_func, "num_classes")
    ), f"{special} input was accepted"
    loss.backward()
    assert torch.isfinite(loss), loss
    assert_input_gradient_finite(x, lambda full: loss_func(full, y))
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


def numeric_arguments(loss_class):
    """The constructor's numeric hyperparameters (real-valued defaults, not
    bool, not the sizes passed positionally)."""
    names = []
    for cls in loss_class.__mro__:
        if cls.__init__ is object.__init__ or not cls.__module__.startswith("pml_fieldlosses"):
            continue
        for p in inspect.signature(cls.__init__).parameters.values():
            default = p.default
            if p.name in ("num_classes", "embedding_size") or p.name in names:
                continue
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                names.append(p.name)
    return names


HYPERPARAMETER_CASES = [
    pytest.param(name, argument, id=f"{name}-{argument}")
    for name, build in ALL_LOSSES.items()
    for argument in numeric_arguments(type(build(3, 4)))
]
EXTREME_VALUES = [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e-45, 1e-30, 1e30, 1e45, 1e300]


@pytest.mark.parametrize("name, argument", HYPERPARAMETER_CASES)
@settings(max_examples=25, **SETTINGS)
@given(
    value=st.one_of(st.sampled_from(EXTREME_VALUES), st.floats(allow_nan=True, allow_infinity=True)),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fuzz_hyperparameters_refused_by_name_or_finite(name, argument, value, dtype, seed):
    loss_class = type(ALL_LOSSES[name](3, 4))
    parameters = inspect.signature(loss_class).parameters
    sizes = (3, 4) if "num_classes" in parameters else ()
    if math.isfinite(value) and value == int(value) and abs(value) < 1e6:
        value = int(value)  # integer arguments get integers too
    kwargs = {"mf_reg_weight": 0.1} if "mf_reg_weight" in parameters else {}  # exercise the regulariser
    kwargs[argument] = value
    try:
        loss_func = loss_class(*sizes, **kwargs)
    except (ValueError, TypeError) as error:
        assert argument in str(error), f"the error does not name {argument}: {error}"
        return
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    y = torch.randint(0, 3, (6,), generator=g)
    loss = loss_func(x, y)
    loss.backward()
    assert torch.isfinite(loss), f"{argument}={value} was accepted but gives loss {loss}"
    assert_input_gradient_finite(x, lambda full: loss_func(full, y))
    for p in loss_func.parameters():
        assert torch.isfinite(p.grad).all(), f"{argument}={value}: non-finite parameter gradient"

"""The DRML head and RelationalLoss under random shapes, dtypes, scales and bad inputs
(hypothesis), and under torch.use_deterministic_algorithms."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_fieldlosses.losses import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder

from .helpers import assert_input_gradient_finite


def build(num_classes, num_branches, branch_in, branch_size):
    embedder = RelationalEmbedder(num_branches * branch_in, num_branches * branch_size, num_branches)
    loss_func = RelationalLoss(
        ProxyAnchorLoss(num_classes, embedder.embedding_size),
        lambda: ProxyAnchorLoss(num_classes, branch_size),
        num_branches,
    )
    return embedder, loss_func


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@st.composite
def cases(draw):
    return dict(
        num_classes=draw(st.integers(1, 8)),
        num_branches=draw(st.integers(1, 4)),
        branch_in=draw(st.integers(1, 8)),
        branch_size=draw(st.integers(1, 8)),
        batch_size=draw(st.integers(1, 16)),
        head_dtype=draw(st.sampled_from(DTYPES)),
        features_dtype=draw(st.sampled_from(DTYPES)),
        autocast=draw(st.booleans()),
        scale=draw(st.sampled_from([1e-20, 1e-3, 1.0, 1e4, 1e19, 1e30, 1e160, 1e300])),
        special=draw(st.sampled_from(["none", "zeros", "duplicates", "nan", "bad_label"])),
        label_dtype=draw(st.sampled_from([torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def dtype_accepted(head_dtype, features_dtype, autocast):
    """docs/models.md: a training-mode head has float32/float64 parameters and computes in
    their dtype; under autocast any features but float64 with a float32 head."""
    if head_dtype not in (torch.float32, torch.float64):
        return False
    return head_dtype == features_dtype or (autocast and torch.float64 not in (head_dtype, features_dtype))


def may_be_too_large(features, head_dtype):
    """Where the head may refuse finite features as too large: the reconstruction error
    (a mean of squares, in at least float32) or, in a half-precision head, the edge
    scores (features times weights) leave the dtype's range; 1e-3 of those bounds."""
    error_dtype = torch.promote_types(head_dtype, torch.float32)
    bound = min(math.sqrt(torch.finfo(error_dtype).max), torch.finfo(head_dtype).max) * 1e-3
    return features.abs().max().item() >= bound


def check_case(case):
    torch.manual_seed(case["seed"])
    embedder, loss_func = build(
        case["num_classes"], case["num_branches"], case["branch_in"], case["branch_size"]
    )
    head_dtype = case["head_dtype"]
    embedder.to(head_dtype)
    loss_func.to(torch.float64 if head_dtype == torch.float64 else torch.float32)
    features = torch.randn(case["batch_size"], embedder.in_features, dtype=torch.float64) * case["scale"]
    labels = torch.randint(0, case["num_classes"], (case["batch_size"],))
    if case["special"] == "zeros":
        features[0] = 0
    elif case["special"] == "duplicates":
        features[:] = features[0].clone()
    elif case["special"] == "nan":
        features[0, 0] = float("nan")
    elif case["special"] == "bad_label":
        labels[0] = case["num_classes"]
    labels = labels.to(case["label_dtype"])
    features = features.to(case["features_dtype"]).requires_grad_()
    finite_features = bool(torch.isfinite(features).all())  # the cast may overflow to inf
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case["autocast"]):
            loss = loss_func(embedder(features), labels)
    except TypeError as error:
        assert not dtype_accepted(head_dtype, case["features_dtype"], case["autocast"]), error
        assert "features have dtype" in str(error) or "train it with float32" in str(error), error
        return
    except ValueError as error:
        message = str(error)
        if "NaN or inf" in message:
            assert not finite_features, message
        elif "too large" in message or "overflows" in message:
            assert finite_features and may_be_too_large(features, head_dtype), message
        else:
            assert case["special"] == "bad_label" and "labels must be in" in message, message
        return
    assert dtype_accepted(head_dtype, case["features_dtype"], case["autocast"]), "dtype pair accepted"
    assert finite_features and case["special"] != "bad_label", f"{case['special']} input was accepted"
    loss.backward()
    assert torch.isfinite(loss)

    def loss_of(full):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case["autocast"]):
            return loss_func(embedder(full), labels)

    assert_input_gradient_finite(features, loss_of)
    for p in list(embedder.parameters()) + list(loss_func.parameters()):
        assert p.dtype in (head_dtype, torch.float32, torch.float64)
        assert p.grad is None or torch.isfinite(p.grad.float()).all()
    if case["special"] == "none" and case["scale"] >= 1e-3 and case["branch_size"] >= 2:
        # no silent zero gradient: huge features get the (tiny) scale-free gradient (with
        # branch_size 1 the nodes are +-1 and the features' gradient is exactly 0)
        assert features.grad.abs().sum() > 0


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_head_fuzz_finite_or_documented_error(case):
    check_case(case)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_head_fuzz_finite_or_documented_error_long(case):
    check_case(case)


def test_head_identical_twice_under_deterministic_algorithms():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        results = []
        for _ in range(2):
            torch.manual_seed(0)
            embedder, loss_func = build(num_classes=10, num_branches=4, branch_in=8, branch_size=4)
            features = torch.randn(30, embedder.in_features, requires_grad=True)
            loss = loss_func(embedder(features), torch.randint(0, 10, (30,)))
            loss.backward()
            parameters = list(embedder.parameters()) + list(loss_func.parameters())
            results.append(
                [loss.detach(), features.grad] + [p.grad for p in parameters if p.grad is not None]
            )
        for a, b in zip(*results):
            assert torch.equal(a, b)
    finally:
        torch.use_deterministic_algorithms(previous)

"""The DRML head and RelationalLoss under random shapes, dtypes, scales and bad inputs
(hypothesis), and under torch.use_deterministic_algorithms."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_fieldlosses.losses import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder


def build(num_classes, num_branches, branch_in, branch_size):
    embedder = RelationalEmbedder(num_branches * branch_in, num_branches * branch_size, num_branches)
    loss_func = RelationalLoss(
        ProxyAnchorLoss(num_classes, embedder.embedding_size),
        lambda: ProxyAnchorLoss(num_classes, branch_size),
        num_branches,
    )
    return embedder, loss_func


@st.composite
def cases(draw):
    return dict(
        num_classes=draw(st.integers(1, 8)),
        num_branches=draw(st.integers(1, 4)),
        branch_in=draw(st.integers(1, 8)),
        branch_size=draw(st.integers(1, 8)),
        batch_size=draw(st.integers(1, 16)),
        dtype=draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16])),
        scale=draw(st.sampled_from([1e-20, 1e-3, 1.0, 1e4])),
        special=draw(st.sampled_from(["none", "zeros", "duplicates", "nan", "bad_label"])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def check_case(case):
    torch.manual_seed(case["seed"])
    embedder, loss_func = build(
        case["num_classes"], case["num_branches"], case["branch_in"], case["branch_size"]
    )
    embedder.to(case["dtype"] if case["dtype"] == torch.float64 else torch.float32)
    loss_func.to(torch.float64 if case["dtype"] == torch.float64 else torch.float32)
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
    features = features.to(case["dtype"]).requires_grad_()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case["dtype"] == torch.bfloat16):
            loss = loss_func(
                embedder(features.float() if case["dtype"] == torch.bfloat16 else features), labels
            )
    except (ValueError, TypeError) as error:
        assert case["special"] in ("nan", "bad_label"), f"unexpected refusal: {error}"
        return
    assert case["special"] in ("none", "zeros", "duplicates"), f"{case['special']} input was accepted"
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(features.grad.float()).all()
    for p in list(embedder.parameters()) + list(loss_func.parameters()):
        assert p.dtype in (torch.float32, torch.float64)
        assert p.grad is None or torch.isfinite(p.grad).all()


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

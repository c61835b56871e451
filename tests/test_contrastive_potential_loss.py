"""ContrastivePotentialLoss against the naive loop reference (value and
gradients; its dense and its scalable path), edge cases, gradcheck, bad
input, mixed precision."""

import math

import pytest
import torch

from pml_fieldlosses import losses

from .helpers import (
    DTYPES,
    EMBEDDING_SIZE,
    LABEL_PATTERNS,
    NUM_CLASSES,
    assert_input_gradient_finite,
    generator_for,
)
from .naive_potential import (
    CPML_CASES,
    PATHS,
    check_against_naive,
    check_cases_match_naive,
    on_path,
    random_inputs,
)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", LABEL_PATTERNS)
@pytest.mark.parametrize("case", CPML_CASES)
def test_matches_naive(case, pattern, dtype, normalized, path):
    check_cases_match_naive(CPML_CASES, case, pattern, dtype, normalized, path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("normalize_proxies", [True, False])
def test_proxies_per_class_and_raw_proxies_match_naive(M, normalize_proxies, dtype, path):
    g = generator_for("CPML M", M, normalize_proxies, dtype)
    build, naive = CPML_CASES["delta0.6_rdelta1.2"]
    labels = [0, 0, 2, 2, 2, 5, 5, 1, 8]
    x, proxies = random_inputs(len(labels), NUM_CLASSES, M, dtype, g, proxy_scale=0.45)
    loss_fn = on_path(build, path, NUM_CLASSES, EMBEDDING_SIZE, M, normalize_proxies=normalize_proxies)
    check_against_naive(loss_fn.to(dtype), naive, x, labels, proxies, dtype, normalize_proxies)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_duplicated_points_are_finite_and_exact(dtype, path):
    """No distance floor: coincident points of different classes are at the
    bottom of the repulsion well, -0^2 = 0 below its plateau."""
    g = generator_for("CPML duplicates", dtype)
    build, naive = CPML_CASES["delta0.8"]
    x, proxies = random_inputs(5, NUM_CLASSES, 2, dtype, g)
    labels = [0, 1, 1, 3, 4]
    x[1] = x[0] * 3.0
    x[2] = x[0]
    x[4] = x[3]
    proxies[0, 1] = proxies[0, 0]
    proxies[7, 0] = proxies[0, 0]
    proxies[1, 0] = x[0]
    loss_fn = on_path(build, path, NUM_CLASSES, EMBEDDING_SIZE, 2).to(dtype)
    check_against_naive(loss_fn, naive, x, labels, proxies, dtype)


def test_repulsion_is_the_mirror_of_the_attraction():
    """Hand-computed: proxies p0 = (1, 0) (class 0), p1 = (0, 1) (class 1), one
    embedding at angle theta. Same class: max(d, delta)^2; different classes:
    -min(d, repulsion_delta)^2; every pair counted both ways."""
    delta, repulsion_delta = 0.3, 0.5
    loss_fn = losses.ContrastivePotentialLoss(
        2, 2, proxies_per_class=1, delta=delta, repulsion_delta=repulsion_delta
    ).double()
    with torch.no_grad():
        loss_fn.proxies.copy_(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))

    def attraction(d):
        return max(d, delta) ** 2

    def repulsion(d):
        return -(min(d, repulsion_delta) ** 2)

    for theta in [0.1, 1.0]:
        x = torch.tensor([[math.cos(theta), math.sin(theta)]], dtype=torch.float64)
        d0, d1 = 2 * math.sin(theta / 2), 2 * math.sin((math.pi / 2 - theta) / 2)
        proxy_pair = repulsion(math.sqrt(2))
        expected = {
            0: 2 * (attraction(d0) + repulsion(d1) + proxy_pair),
            1: 2 * (repulsion(d0) + attraction(d1) + proxy_pair),
        }
        for label, value in expected.items():
            assert loss_fn(x, torch.tensor([label])).item() == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CPML_CASES)
def test_gradcheck_float64(case, path):
    g = generator_for(case, "CPML gradcheck")
    labels = torch.tensor([0, 0, 2, 2, 5, 1])
    x, proxies = random_inputs(len(labels), 6, 2, torch.float64, g)
    x.requires_grad_()
    loss_fn = on_path(CPML_CASES[case][0], path, 6, EMBEDDING_SIZE, 2).double()
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    assert torch.autograd.gradcheck(lambda x, p: loss_fn(x, labels), (x, loss_fn.proxies))


def test_bf16_autocast_keeps_float32_proxies_and_finite_gradients():
    """Under bfloat16 autocast the loss is the float32 loss of the bfloat16 embeddings (a small
    difference of large pair sums: its distance to the float32 embeddings' loss is not
    bounded relative to it), with float32 proxies and finite gradients."""
    g = generator_for("CPML bf16")
    embedder = torch.nn.Linear(8, EMBEDDING_SIZE)
    loss_fn = losses.ContrastivePotentialLoss(NUM_CLASSES, EMBEDDING_SIZE, delta=0.8)
    data, labels = torch.randn(12, 8, generator=g), torch.randint(0, NUM_CLASSES, (12,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = embedder(data)
        loss = loss_fn(embeddings, labels)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert loss_fn.proxies.dtype == torch.float32 and torch.isfinite(loss_fn.proxies.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in embedder.parameters())
    assert torch.equal(loss.detach(), loss_fn(embeddings.detach().float(), labels).detach())


def test_defaults():
    loss_fn = losses.ContrastivePotentialLoss(3, 4)
    assert (loss_fn.proxies_per_class, loss_fn.delta, loss_fn.repulsion_delta) == (2, 0.2, 0.2)
    assert not hasattr(loss_fn, "alpha")
    assert set(loss_fn.state_dict()) == {"proxies"}


BAD_CONSTRUCTIONS = [
    ({"num_classes": 0}, "num_classes"),
    ({"embedding_size": -1}, "embedding_size"),
    ({"proxies_per_class": 0}, "proxies_per_class"),
    ({"delta": 0}, "delta"),
    ({"repulsion_delta": 0}, "repulsion_delta"),
    ({"repulsion_delta": -0.5}, "repulsion_delta"),
]


@pytest.mark.parametrize("kwargs, message", BAD_CONSTRUCTIONS)
def test_bad_hyperparameters_raise_at_construction(kwargs, message):
    kwargs = {"num_classes": 5, "embedding_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        losses.ContrastivePotentialLoss(**kwargs)
    with pytest.raises(TypeError):
        losses.ContrastivePotentialLoss(5, 4, alpha=2.0)


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 1e-45, 1e-6, 1e6, 1e30, 1e300], ids=str
)
@pytest.mark.parametrize("argument", ["delta", "repulsion_delta"])
def test_every_numeric_hyperparameter_refused_by_name_or_finite(argument, value):
    """NaN, inf, non-positive and overflowing radii (delta^2
    beyond float32's range) are refused by name; accepted ones give finite
    losses and gradients in float16 (computed in float32), float32, float64."""
    try:
        loss_fn = losses.ContrastivePotentialLoss(5, 4, **{argument: value})
    except ValueError as error:
        assert argument in str(error)
        return
    assert 0 < value < float("inf")
    labels = torch.tensor([0, 0, 1, 2, 3, 3])
    for dtype in [torch.float16, torch.float32, torch.float64]:
        x = torch.randn(6, 4, generator=generator_for("CPML extremes", argument, value), dtype=torch.float64)
        x = x.to(dtype).requires_grad_()
        loss_fn.zero_grad()
        loss = loss_fn(x, labels)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(loss_fn.proxies.grad).all()
        # float16: the float32 gradient, cast (inf where it leaves float16's range)
        assert_input_gradient_finite(x, lambda full: loss_fn(full, labels))

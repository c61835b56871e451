"""The relational head's and loss's hand-written backwards against the plain operations they
replace, in float64 at 1e-12 (values and gradients): the ProxyAnchor terms of the base and
branch losses in one autograd Function, the unit rows (the nodes' normalisation),
BranchLinear's backward and the edge projections read in one pass over the features."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from pml_fieldlosses.losses.relational_proxy_anchor import ProxyAnchorGroups
from pml_fieldlosses.models.relational_embedder import (
    BranchLinear,
    BranchLinearFunction,
    branch_linear,
    projections,
)
from pml_fieldlosses.utils.loss_utils import UnitRows, index_counts, unit_rows

from .helpers import assert_close


def plain_proxy_anchor_groups(cos, labels, group, num_groups, alpha, margin):
    """The groups' ProxyAnchor terms with autograd through plain ops, group by group (a loop):
    PML's logsumexp(add_one=True) over the group's rows, masked to the positives and to the
    negatives, PML's divisors."""
    C = cos.shape[1]
    terms = []
    for g in range(num_groups):
        a = float(alpha[g]) if torch.is_tensor(alpha) else alpha
        m = float(margin[g]) if torch.is_tensor(margin) else margin
        rows = cos[group == g]
        positive = torch.nn.functional.one_hot(labels[group == g], C).bool()
        pos_term = lmu.logsumexp(a * (m - rows), keep_mask=positive, add_one=True, dim=0)
        neg_term = lmu.logsumexp(a * (rows + m), keep_mask=~positive, add_one=True, dim=0)
        present = positive.any(dim=0).sum()
        terms.append(pos_term.sum() / present + neg_term.sum() / C)
    return torch.stack(terms)


@settings(max_examples=60, deadline=None)
@given(
    G=st.integers(1, 4),
    C=st.integers(1, 6),
    groups=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    per_group=st.booleans(),
    alpha=st.sampled_from([1.0, 32.0, 200.0]),
    margin=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 2**16),
)
def test_one_function_equals_the_plain_ops(G, C, groups, per_group, alpha, margin, seed):
    """Groups of different sizes in any order (every group given a row), one label or several,
    large alpha (the shifts), alpha and margin per group or shared, every gradient."""
    g = torch.Generator().manual_seed(seed)
    group = torch.tensor([x % G for x in groups] + list(range(G)))
    group = group[torch.randperm(len(group), generator=g)]
    cos = (2 * torch.rand(len(group), C, generator=g, dtype=torch.float64) - 1).requires_grad_()
    labels = torch.randint(0, C, (len(group),), generator=g)
    if per_group:  # as for a base loss and branch losses of other alpha and margin
        alpha = alpha * (1 + torch.rand(G, generator=g, dtype=torch.float64))
        margin = margin + 0.1 * torch.rand(G, generator=g, dtype=torch.float64)
    fast = ProxyAnchorGroups.apply(cos, labels, group, G, alpha, margin)
    plain = plain_proxy_anchor_groups(cos, labels, group, G, alpha, margin)
    assert_close(fast, plain, torch.float64)
    upstream = torch.randn(G, generator=g, dtype=torch.float64)
    assert_close(
        torch.autograd.grad(fast, cos, upstream)[0],
        torch.autograd.grad(plain, cos, upstream)[0],
        torch.float64,
    )


def test_a_column_far_below_its_shift_gives_zero_not_nan():
    """alpha 1000: exponentials that underflow to 0 in every column but the largest entry's,
    and a column whose only negative entries underflow; the values and gradients stay finite."""
    cos = torch.tensor([[0.9, -0.9], [-0.9, 0.9], [0.5, 0.5]], dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 0])
    group = torch.zeros(3, dtype=torch.long)
    fast = ProxyAnchorGroups.apply(cos, labels, group, 1, 1000.0, 0.1)
    plain = plain_proxy_anchor_groups(cos, labels, group, 1, 1000.0, 0.1)
    assert_close(fast, plain, torch.float64)
    (grad,) = torch.autograd.grad(fast.sum(), cos)
    assert torch.isfinite(grad).all()
    assert_close(grad, torch.autograd.grad(plain.sum(), cos)[0], torch.float64)


@settings(max_examples=20, deadline=None)
@given(
    shape=st.sampled_from([(3, 4), (5, 2, 3), (2, 3, 1)]),
    scale=st.sampled_from([1e-14, 1.0, 1e3]),
    zero_row=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_unit_rows_and_its_backward_equal_the_plain_ops(shape, scale, zero_row, seed):
    """Norms below eps (scale 1e-14, an all-zero row), where the clamp holds the norm at eps."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(*shape, generator=g, dtype=torch.float64)
    if zero_row:
        x.view(-1, shape[-1])[0].zero_()
    x.requires_grad_()
    upstream = torch.randn(*shape, generator=g, dtype=torch.float64)
    fast, fast_norms = UnitRows.apply(x, 1e-12)
    plain, plain_norms = unit_rows(x, 1e-12)
    assert torch.equal(fast, plain) and torch.equal(fast_norms, plain_norms)
    # 1e-12 of the gradient's own scale, |upstream| / max(||x||, eps): where the exact gradient
    # cancels to 0 (rows of one entry: x / |x| is constant) the plain ops leave rounding noise
    # of that scale, which the hand-written backward does not
    natural = (upstream.abs() / fast_norms.clamp_min(1e-12)).max().item()
    torch.testing.assert_close(
        torch.autograd.grad(fast, x, upstream)[0],
        torch.autograd.grad(plain, x, upstream)[0],
        rtol=1e-12,
        atol=1e-12 * natural,
    )


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 6),
    K=st.integers(1, 4),
    n_in=st.integers(1, 5),
    out=st.integers(1, 5),
    frozen=st.sampled_from([None, "x", "weight", "bias"]),
    seed=st.integers(0, 2**16),
)
def test_branch_linear_backward_equals_the_plain_ops(batch, K, n_in, out, frozen, seed):
    """The input as the head gives it (a reshaped (batch, K * n_in) tensor) and every gradient."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, K * n_in, generator=g, dtype=torch.float64).requires_grad_(frozen != "x")
    weight = torch.randn(K, out, n_in, generator=g, dtype=torch.float64).requires_grad_(frozen != "weight")
    bias = torch.randn(K, out, generator=g, dtype=torch.float64).requires_grad_(frozen != "bias")
    x = features.reshape(batch, K, n_in)
    upstream = torch.randn(batch, K, out, generator=g, dtype=torch.float64)
    inputs = [t for t in (features, weight, bias) if t.requires_grad]
    fast = BranchLinearFunction.apply(x, weight, bias)
    plain = branch_linear(x, weight, bias)
    assert torch.equal(fast, plain)
    for got, expected in zip(
        torch.autograd.grad(fast, inputs, upstream), torch.autograd.grad(plain, inputs, upstream)
    ):
        assert got.shape == expected.shape
        assert_close(got, expected, torch.float64)


def test_projections_equal_the_plain_ops():
    """direction . layer(x) for each layer, against the layers' full outputs."""
    torch.manual_seed(0)
    layers = [BranchLinear(3, 4, 5).double() for _ in range(2)]
    for layer in layers:
        torch.nn.init.normal_(layer.bias)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    direction = torch.randn(5, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(6, 3, 2, dtype=torch.float64)
    parameters = [direction] + [p for layer in layers for p in layer.parameters()]
    fast = projections(x, layers, direction)
    plain = torch.stack([branch_linear(x, layer.weight, layer.bias) @ direction for layer in layers], dim=-1)
    assert fast.is_contiguous()
    assert_close(fast, plain, torch.float64)
    for got, expected in zip(
        torch.autograd.grad(fast, parameters, upstream), torch.autograd.grad(plain, parameters, upstream)
    ):
        assert_close(got, expected, torch.float64)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.integers(0, 30), max_size=200), extra=st.integers(0, 5))
def test_index_counts_equal_bincount(values, extra):
    """index_counts (the losses' counts without a GPU's host read) equals torch.bincount for
    indices below the size, empty ones included, in int64."""
    index = torch.tensor(values, dtype=torch.int64)
    size = max(values, default=-1) + 1 + extra
    counts = index_counts(index, size)
    assert counts.dtype == torch.int64 and torch.equal(counts, torch.bincount(index, minlength=size))

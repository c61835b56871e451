"""The relational head's and loss's hand-written backwards against the plain operations they
replace, in float64 at 1e-12 (values and gradients): the K ProxyAnchor branch losses in one
autograd Function, the unit rows (the nodes' normalisation), BranchLinear's backward and the
edge projections read in one pass over the features."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.utils import loss_and_miner_utils as lmu

from pml_fieldlosses.losses.relational_branches import ProxyAnchorBranches, proxy_anchor_branches
from pml_fieldlosses.models.relational_embedder import (
    BranchLinear,
    BranchLinearFunction,
    branch_linear,
    projections,
)
from pml_fieldlosses.utils.loss_utils import UnitRows, index_counts, log1p_sum_exp, unit_rows

from .helpers import assert_close


def plain_proxy_anchor_branches(grouped, labels, counts, proxies, alpha, margin):
    """The branch losses with autograd through plain ops: each branch's rows unit-normalised,
    padded with zero rows, PML's ProxyAnchor terms: the negatives through PML's own logsumexp
    (branch by branch), the positives as grouped log(1 + sum exp)."""
    K, C = proxies.shape[:2]
    M = max(counts)
    sizes = torch.tensor(counts)
    branch = torch.repeat_interleave(torch.arange(K), sizes)
    row = torch.arange(len(grouped)) - (sizes.cumsum(0) - sizes)[branch]
    x = torch.nn.functional.normalize(grouped, dim=1)
    p = torch.nn.functional.normalize(proxies, dim=2)
    padded = x.new_zeros(K, M, x.shape[1]).index_put((branch, row), x)
    cos = torch.bmm(padded, p.transpose(1, 2))
    negative = torch.zeros(K, M, C, dtype=torch.bool)
    negative[branch, row] = True
    negative[branch, row, labels] = False
    group = branch * C + labels
    pos_term = log1p_sum_exp(alpha * (margin - cos[branch, row, labels]), group, K * C).view(K, C)
    neg_values = alpha * (cos + margin)
    neg_term = torch.stack(
        [
            lmu.logsumexp(neg_values[k], keep_mask=negative[k], add_one=True, dim=0).squeeze(0)
            for k in range(K)
        ]
    )
    with_positives = torch.bincount(group, minlength=K * C).view(K, C).gt(0).sum(dim=1)
    return (pos_term.sum(dim=1) / with_positives + neg_term.sum(dim=1) / C).sum()


class FakeProxyAnchor:
    """What proxy_anchor_branches reads of a PML ProxyAnchorLoss."""

    def __init__(self, proxies, alpha, margin):
        self.proxies, self.alpha, self.margin, self.num_classes = proxies, alpha, margin, len(proxies)

    def cast_types(self, dtype, device):
        pass


@settings(max_examples=40, deadline=None)
@given(
    K=st.integers(1, 4),
    C=st.integers(1, 6),
    E=st.integers(2, 5),  # E = 1: the nodes' gradient is 0, which the plain ops give as rounding noise
    sizes=st.lists(st.integers(1, 5), min_size=4, max_size=4),
    alpha=st.sampled_from([1.0, 32.0, 200.0]),
    margin=st.sampled_from([0.0, 0.1, 0.5]),
    zero_row=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_one_function_equals_the_plain_ops(K, C, E, sizes, alpha, margin, zero_row, seed):
    """Branches of different sizes (padding rows), large alpha (the shifts), an all-zero
    node or proxy (the clamped norm), every gradient."""
    g = torch.Generator().manual_seed(seed)
    counts = sizes[:K]
    B = sum(counts)
    nodes = torch.randn(B, K, E, generator=g, dtype=torch.float64)
    proxies = torch.randn(K, C, E, generator=g, dtype=torch.float64)
    if zero_row:
        nodes[0].zero_()
        proxies[0, 0].zero_()
    nodes.requires_grad_()
    proxies.requires_grad_()
    labels = torch.randint(0, C, (B,), generator=g)
    # the samples grouped by branch: branch k holds counts[k] of them, in a shuffled order
    order = torch.randperm(B, generator=g)
    branch_of = torch.repeat_interleave(torch.arange(K), torch.tensor(counts))
    assignment = torch.empty(B, dtype=torch.long)
    assignment[order] = branch_of
    losses = [FakeProxyAnchor(proxies[k], alpha, margin) for k in range(K)]
    fast = proxy_anchor_branches(losses, nodes, labels, order, list(range(K)), counts)
    plain = plain_proxy_anchor_branches(
        nodes[order, assignment[order]], labels[order], counts, proxies, alpha, margin
    )
    assert_close(fast, plain, torch.float64)
    upstream = torch.tensor(1.7, dtype=torch.float64)
    for got, expected in zip(
        torch.autograd.grad(fast, [nodes, proxies], upstream),
        torch.autograd.grad(plain, [nodes, proxies], upstream),
    ):
        assert_close(got, expected, torch.float64)


def test_the_function_computes_only_the_gradients_needed():
    g = torch.Generator().manual_seed(0)
    nodes = torch.randn(5, 2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    proxies = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)  # frozen
    losses = [FakeProxyAnchor(proxies[k], 32.0, 0.1) for k in range(2)]
    order = torch.tensor([3, 0, 1, 4, 2])
    value = proxy_anchor_branches(losses, nodes, torch.tensor([0, 1, 1, 3, 2]), order, [0, 1], [2, 3])
    assert type(value.grad_fn).__name__ == f"{ProxyAnchorBranches.__name__}Backward"
    (grad,) = torch.autograd.grad(value, [nodes])
    assert grad.shape == nodes.shape


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

"""RelationalLoss's one-pass ProxyAnchor terms (pml_fieldlosses/losses/relational_proxy_anchor.py):
for PML's ProxyAnchorLoss as the base loss and/or the branch loss, the base loss and the K
branch losses are computed together; the value and every gradient must be those of calling
the base loss on the embeddings and each branch loss on its own samples, and everything the
one pass does not reproduce must be called loss by loss."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytorch_metric_learning import losses, miners, reducers, regularizers

from pml_fieldlosses.losses import RelationalLoss
from pml_fieldlosses.losses.relational_proxy_anchor import batchable_proxy_anchor
from pml_fieldlosses.models.relational_embedder import BranchOutputs

from .helpers import assert_close


def outputs(batch, K, E, generator, dtype=torch.float64):
    """Embeddings carrying random branch outputs, as a head's training forward attaches them."""
    embeddings = torch.randn(batch, K * E, generator=generator, dtype=dtype).requires_grad_()
    nodes = torch.nn.functional.normalize(torch.randn(batch, K, E, generator=generator, dtype=dtype), dim=2)
    nodes.requires_grad_()
    errors = torch.rand(batch, K, generator=generator, dtype=dtype).requires_grad_()
    return embeddings, nodes, errors


def attach(embeddings, nodes, errors):
    out = embeddings * 1
    out.branch_outputs = BranchOutputs(nodes * 1, errors * 1, out._version)
    return out


def branch_by_branch(loss_fn, nodes, errors, labels):
    """What RelationalLoss's branch term is by definition: each branch loss called on the
    nodes and labels of its samples (batch order), an empty branch skipped."""
    assignment = errors.detach().argmin(dim=1)
    total = 0
    for k in range(nodes.shape[1]):
        members = torch.nonzero(assignment == k).squeeze(1)
        if len(members):
            total = total + loss_fn.branch_loss_of(k)(nodes[members, k], labels[members])
    return total


@st.composite
def cases(draw):
    K = draw(st.integers(1, 4))
    return {
        "K": K,
        "E": draw(st.integers(1, 5)),
        "C": draw(st.integers(1, 6)),
        "batch": draw(st.integers(1, 12)),
        # the branches each sample goes to (some branches often empty)
        "branches": draw(st.lists(st.integers(0, K - 1), min_size=12, max_size=12)),
        "shared": draw(st.booleans()),
        "margin": draw(st.sampled_from([0.0, 0.1, 0.5])),
        "alpha": draw(st.sampled_from([1.0, 32.0, 200.0])),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_one_pass_equals_the_branch_losses_called_one_by_one(case):
    """float64, 1e-12: the loss and the gradients w.r.t. the nodes and every branch's proxies
    (None for a branch with no sample: its loss is never called, as before), for separate
    and shared (the same module K times) branch losses, empty branches and single samples."""
    K, E, C, B = case["K"], case["E"], case["C"], case["batch"]
    g = torch.Generator().manual_seed(case["seed"])
    torch.manual_seed(case["seed"])
    if case["shared"]:
        branch_losses = [losses.ProxyAnchorLoss(C, E, margin=case["margin"], alpha=case["alpha"])] * K
    else:
        branch_losses = lambda: losses.ProxyAnchorLoss(C, E, margin=case["margin"], alpha=case["alpha"])
    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(C, K * E), branch_losses=branch_losses, num_branches=K, embedding_size=K * E
    ).double()
    assert batchable_proxy_anchor([loss_fn.branch_loss_of(k) for k in range(K)])
    _, nodes, errors = outputs(B, K, E, g)
    with torch.no_grad():  # each sample's smallest error on its drawn branch
        errors[torch.arange(B), torch.tensor(case["branches"][:B])] -= 2
    labels = torch.randint(0, C, (B,), generator=g)

    proxies = [loss_fn.branch_loss_of(k).proxies for k in range(K)]
    inputs = [nodes, *dict.fromkeys(proxies)]
    value = loss_fn.branch_loss(nodes, errors, labels, None)
    expected = branch_by_branch(loss_fn, nodes, errors, labels)
    assert_close(value, expected, torch.float64)
    grads = torch.autograd.grad(value, inputs, allow_unused=True)
    expected_grads = torch.autograd.grad(expected, inputs, allow_unused=True)
    for grad, expected_grad in zip(grads, expected_grads):
        assert (grad is None) == (expected_grad is None)
        if grad is not None:
            assert_close(grad, expected_grad, torch.float64)


@pytest.mark.parametrize("base_classes", [5, 7])
def test_the_whole_loss_and_its_gradients_equal_the_branch_by_branch_loss(base_classes):
    """RelationalLoss.forward with the one pass against the loss assembled from the base loss
    and the branch losses called one by one, in float32 and float64: a base loss with the
    branch losses' num_classes (their rows in one pass) and with another (two passes), and
    another margin and alpha than theirs."""
    K, E, C, B = 3, 4, 5, 17
    for dtype in (torch.float32, torch.float64):
        g = torch.Generator().manual_seed(1)
        torch.manual_seed(1)
        loss_fn = RelationalLoss(
            losses.ProxyAnchorLoss(base_classes, K * E),
            branch_losses=lambda: losses.ProxyAnchorLoss(C, E, margin=0.2, alpha=8),
            num_branches=K,
            embedding_size=K * E,
            representation_weight=10.0,
        ).to(dtype)
        embeddings, nodes, errors = outputs(B, K, E, g, dtype)
        labels = torch.randint(0, C, (B,), generator=g)
        inputs = [embeddings, nodes, errors, *loss_fn.parameters()]
        value = loss_fn(attach(embeddings, nodes, errors), labels)
        expected = (
            branch_by_branch(loss_fn, nodes, errors, labels)
            + 10.0 * loss_fn.base_loss(embeddings, labels)
            + errors.mean()
        )
        assert_close(value, expected, dtype)
        for grad, expected_grad in zip(
            torch.autograd.grad(value, inputs), torch.autograd.grad(expected, inputs)
        ):
            assert_close(grad, expected_grad, dtype)


def test_proxies_follow_the_nodes_dtype_as_in_a_pml_call():
    """PML's ProxyAnchorLoss casts its proxies to the embeddings' dtype on each call; the
    one pass does the same to the losses it computes (and only to those)."""
    K, E, C = 2, 3, 4
    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(C, K * E), branch_losses=lambda: losses.ProxyAnchorLoss(C, E), num_branches=K
    )
    g = torch.Generator().manual_seed(0)
    _, nodes, errors = outputs(5, K, E, g)
    with torch.no_grad():
        errors[:, 0] -= 2  # every sample in branch 0: branch 1's loss is not called
    loss_fn.branch_loss(nodes, errors, torch.randint(0, C, (5,), generator=g), None)
    assert loss_fn.branch_loss_of(0).proxies.dtype == torch.float64
    assert loss_fn.branch_loss_of(1).proxies.dtype == torch.float32


def pa(**kwargs):
    return losses.ProxyAnchorLoss(4, 3, **kwargs)


class SubclassedProxyAnchor(losses.ProxyAnchorLoss):
    pass


def hooked():
    loss = pa()
    loss.register_forward_hook(lambda *args: None)
    return loss


NOT_BATCHABLE = {
    "subclass": lambda: [SubclassedProxyAnchor(4, 3)],
    "other loss": lambda: [losses.TripletMarginLoss()],
    "collect_stats": lambda: [pa(collect_stats=True)],
    "reducer": lambda: [pa(reducer=reducers.MeanReducer())],
    "distance": lambda: [pa(distance=losses.ProxyAnchorLoss(4, 3).distance.__class__(power=2))],
    "weight regularizer": lambda: [pa(weight_regularizer=regularizers.LpRegularizer())],
    "embedding regularizer": lambda: [pa(embedding_regularizer=regularizers.LpRegularizer())],
    "forward hook": lambda: [hooked()],
    "different margins": lambda: [pa(margin=0.1), pa(margin=0.2)],
    "different alphas": lambda: [pa(alpha=16), pa(alpha=32)],
    "different num_classes": lambda: [pa(), losses.ProxyAnchorLoss(5, 3)],
}


def test_only_plain_proxy_anchor_losses_are_computed_in_one_pass():
    assert batchable_proxy_anchor([pa(), pa(margin=0.1, alpha=16)][1:])
    assert batchable_proxy_anchor([pa(), pa()])
    assert not batchable_proxy_anchor([])
    for name, build in NOT_BATCHABLE.items():
        assert not batchable_proxy_anchor(build()), name


def test_hooks_miners_and_tuples_still_see_each_branch_call():
    """A forward hook on a branch loss, a branch miner or a miner's tuples: the branch
    losses are called one by one, each on its own samples."""
    K, E, C, B = 2, 3, 4, 10
    g = torch.Generator().manual_seed(2)
    _, nodes, errors = outputs(B, K, E, g)
    labels = torch.randint(0, C, (B,), generator=g)
    expected_sizes = sorted(torch.bincount(errors.argmin(dim=1), minlength=K).tolist())

    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(C, K * E), branch_losses=lambda: losses.ProxyAnchorLoss(C, E), num_branches=K
    ).double()
    sizes = []
    for k in range(K):
        loss_fn.branch_loss_of(k).register_forward_hook(lambda module, args, out: sizes.append(len(args[0])))
    loss_fn.branch_loss(nodes, errors, labels, None)
    assert sorted(sizes) == expected_sizes

    mined = []
    miner = miners.MultiSimilarityMiner()
    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(C, K * E),
        branch_losses=lambda: losses.ProxyAnchorLoss(C, E),
        num_branches=K,
        branch_miner=lambda x, y: mined.append(len(x)) or miner(x, y),
    ).double()
    value = loss_fn.branch_loss(nodes, errors, labels, None)
    assert sorted(mined) == expected_sizes
    assert_close(value, branch_by_branch_mined(loss_fn, miner, nodes, errors, labels), torch.float64)


def branch_by_branch_mined(loss_fn, miner, nodes, errors, labels):
    assignment = errors.detach().argmin(dim=1)
    total = 0
    for k in range(nodes.shape[1]):
        members = torch.nonzero(assignment == k).squeeze(1)
        if len(members):
            x, y = nodes[members, k], labels[members]
            total = total + loss_fn.branch_loss_of(k)(x, y, miner(x, y))
    return total


@pytest.mark.parametrize("called", ["base", "branches"])
def test_the_term_that_must_be_called_is_called_and_the_other_still_in_one_pass(called):
    """A forward hook on the base loss (it must see its call) with plain branch losses, or a
    branch miner (the branch losses are called) with a plain base loss: the loss and its
    gradients are still those of calling every loss, float64, 1e-12."""
    K, E, C, B = 2, 3, 4, 11
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    miner = miners.MultiSimilarityMiner()
    calls = []
    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(C, K * E),
        branch_losses=lambda: losses.ProxyAnchorLoss(C, E),
        num_branches=K,
        branch_miner=miner if called == "branches" else None,
    ).double()
    if called == "base":
        loss_fn.base_loss.register_forward_hook(lambda module, args, out: calls.append(len(args[0])))
    else:
        for k in range(K):
            loss_fn.branch_loss_of(k).register_forward_hook(
                lambda module, args, out: calls.append(len(args[0]))
            )
    embeddings, nodes, errors = outputs(B, K, E, g)
    labels = torch.randint(0, C, (B,), generator=g)
    inputs = [embeddings, nodes, errors, *loss_fn.parameters()]
    value = loss_fn(attach(embeddings, nodes, errors), labels)
    assert sum(calls) == B  # the base loss on the batch, or the branch losses on all its samples
    branches = (
        branch_by_branch_mined(loss_fn, miner, nodes, errors, labels)
        if called == "branches"
        else branch_by_branch(loss_fn, nodes, errors, labels)
    )
    expected = branches + loss_fn.base_loss(embeddings, labels) + errors.mean()
    assert_close(value, expected, torch.float64)
    for grad, expected_grad in zip(torch.autograd.grad(value, inputs), torch.autograd.grad(expected, inputs)):
        assert_close(grad, expected_grad, torch.float64)


def test_frozen_proxies_get_no_gradient_and_the_rest_is_unchanged():
    """Proxies that do not train (requires_grad False, base and branches): the one pass leaves
    them without gradient, and the embeddings' and nodes' gradients are those of calling each
    loss, float64, 1e-12."""
    K, E, C, B = 3, 4, 5, 13
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(C, K * E), branch_losses=lambda: losses.ProxyAnchorLoss(C, E), num_branches=K
    ).double()
    loss_fn.requires_grad_(False)
    embeddings, nodes, errors = outputs(B, K, E, g)
    labels = torch.randint(0, C, (B,), generator=g)
    value = loss_fn(attach(embeddings, nodes, errors), labels)
    expected = (
        branch_by_branch(loss_fn, nodes, errors, labels)
        + loss_fn.base_loss(embeddings, labels)
        + errors.mean()
    )
    assert_close(value, expected, torch.float64)
    inputs = [embeddings, nodes, errors]
    for grad, expected_grad in zip(torch.autograd.grad(value, inputs), torch.autograd.grad(expected, inputs)):
        assert_close(grad, expected_grad, torch.float64)
    assert all(p.grad is None for p in loss_fn.parameters())

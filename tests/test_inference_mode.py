"""Every loss and the DRML head under torch.inference_mode() and torch.no_grad() (a validation
loss): the grad-mode value, and training afterwards is unaffected (docs/losses.md, "Inference
mode and torch.compile")."""

import copy

import pytest
import torch
from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_fieldlosses import losses
from pml_fieldlosses.losses.potential import distances
from pml_fieldlosses.models import RelationalEmbedder

from .loss_registry import ALL_LOSSES

C, D, IN_FEATURES, K = 5, 8, 16, 4
LABELS = torch.tensor([0, 0, 1, 1, 1, 3, 3, 4, 4, 4, 1, 0])
CONTEXTS = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}

# our losses on a plain embedder, and the potential losses' scalable path (the neighbour list)
LOSSES = {
    **{name: (lambda make=make: make(C, D)) for name, make in ALL_LOSSES.items()},
    "PotentialField_scalable": lambda: losses.PotentialFieldLoss(C, D, dense=False),
    "ContrastivePotential_scalable": lambda: losses.ContrastivePotentialLoss(C, D, dense=False),
}


def inputs(dtype=torch.float64, size=D, seed=0):
    return torch.randn(len(LABELS), size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def training_step(loss_fn, x, embedder=None):
    """One SGD step of the loss (and embedder) on x; returns the loss."""
    modules = [m for m in (embedder, loss_fn) if m is not None]
    parameters = [p for m in modules for p in m.parameters()]
    x = x.clone().requires_grad_()
    loss = loss_fn(embedder(x) if embedder is not None else x, LABELS)
    loss.backward()
    if parameters:
        torch.optim.SGD(parameters, lr=0.1).step()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    return loss


def assert_no_inference_state(*modules):
    """Parameters and buffers made or cast under inference mode would refuse later in-place
    updates (optimiser steps, a memory's queue) outside it."""
    for module in modules:
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            assert not tensor.is_inference() and not tensor.data.is_inference(), name


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("loss_name", LOSSES)
@pytest.mark.parametrize("loss_dtype", [torch.float64, torch.float32], ids=str)
def test_every_loss_gives_its_grad_mode_value_then_trains(loss_name, context, loss_dtype):
    """A float32 loss fed float64 embeddings casts its parameters (PML's cast_types) inside
    the context: they must stay ordinary parameters."""
    torch.manual_seed(0)
    loss_fn = LOSSES[loss_name]().to(loss_dtype)
    reference = copy.deepcopy(loss_fn)
    x = inputs()
    expected = reference(x, LABELS)
    with CONTEXTS[context]():
        value = loss_fn(x, LABELS)
    assert torch.equal(value, expected)
    assert_no_inference_state(loss_fn)
    # training after the context: the same step as a twin that never saw it
    assert torch.equal(training_step(loss_fn, x), training_step(reference, x))
    for got, want in zip(loss_fn.parameters(), reference.parameters()):
        assert torch.equal(got, want)
    assert torch.equal(loss_fn(x, LABELS), reference(x, LABELS))


@pytest.mark.parametrize("loss_name", ["PotentialField_scalable", "ContrastivePotential_scalable"])
def test_a_neighbour_list_made_under_inference_mode_serves_training(loss_name):
    """The list is built under inference mode, then updated (re-anchored, rebuilt) by Adam
    steps interleaved with more inference-mode calls: the same values and proxies as a
    loss trained without them (the results do not depend on the list's history)."""
    torch.manual_seed(0)
    loss_fn = LOSSES[loss_name]()
    loss_fn.all_pairs_entries = 0  # the neighbour list, not the search of all these few points' pairs
    reference = copy.deepcopy(loss_fn)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.2) for m in (loss_fn, reference)]
    with torch.inference_mode():
        loss_fn(inputs(seed=1), LABELS)
    for step in range(4):
        x = inputs(seed=step + 2)
        for module, optimizer in zip((loss_fn, reference), optimizers):
            optimizer.zero_grad()
            module(x, LABELS).backward()
            optimizer.step()
        with torch.inference_mode():
            loss_fn(x, LABELS)
        assert torch.equal(loss_fn.proxies, reference.proxies)
    assert loss_fn.neighbor_list.stats.num_builds >= 1
    assert torch.equal(loss_fn(inputs(seed=9), LABELS), reference(inputs(seed=9), LABELS))


@pytest.mark.parametrize("bfloat16", [True, False], ids=["bfloat16-products", "float32-products"])
@pytest.mark.parametrize("loss_name", ["PotentialField_scalable", "ContrastivePotential_scalable"])
def test_the_search_of_all_pairs_first_run_under_inference_mode_serves_training(
    loss_name, bfloat16, monkeypatch
):
    """The search of all pairs (float32 points, its products bfloat16 or not) first runs under
    inference mode, where the buffers it keeps between calls are made; training steps after it
    write into them: the same values and proxies as a loss trained without that call."""
    monkeypatch.setattr(distances.Bfloat16Choice, "min_multiply_adds", 0)  # bfloat16 at any size
    torch.manual_seed(0)
    loss_fn = LOSSES[loss_name]()
    loss_fn.bfloat16_search = bfloat16
    loss_fn.list_for_few_points = False  # the search of all pairs at every step
    reference = copy.deepcopy(loss_fn)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.2) for m in (loss_fn, reference)]
    with torch.inference_mode():
        loss_fn(inputs(torch.float32, seed=1), LABELS)
    for step in range(3):
        x = inputs(torch.float32, seed=step + 2)
        for module, optimizer in zip((loss_fn, reference), optimizers):
            optimizer.zero_grad()
            module(x, LABELS).backward()
            optimizer.step()
        assert torch.equal(loss_fn.proxies, reference.proxies)
    assert loss_fn.neighbor_list.state is None  # (the search of all pairs, no list)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_embeddings_and_labels_made_under_inference_mode_used_outside_it(loss_name):
    """Validation embeddings and labels (e.g. moved to the device) made under inference mode,
    the loss computed after it, with grad enabled: the same value, no autograd error."""
    torch.manual_seed(0)
    loss_fn = LOSSES[loss_name]()
    x = inputs()
    expected = copy.deepcopy(loss_fn)(x, LABELS)
    with torch.inference_mode():
        x_inference, labels_inference = x.clone(), LABELS.clone()
    value = loss_fn(x_inference, labels_inference)
    assert torch.equal(value, expected)
    if value.requires_grad:  # the loss's own parameters
        value.backward()


def make_drml():
    torch.manual_seed(0)
    embedder = RelationalEmbedder(IN_FEATURES, D, K).double()
    loss_fn = relational_loss(C)
    return embedder, loss_fn


def relational_loss(num_classes):
    return losses.RelationalLoss(
        ProxyAnchorLoss(num_classes, D),
        branch_losses=lambda: ProxyAnchorLoss(num_classes, D // K),
        num_branches=K,
        embedding_size=D,
    ).double()


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("context", CONTEXTS)
def test_the_relational_head_gives_its_grad_mode_output(context, training):
    embedder, _ = make_drml()
    embedder.train(training)
    x = inputs(size=IN_FEATURES)
    expected = embedder(x)
    with CONTEXTS[context]():
        embeddings = embedder(x)
    assert torch.equal(embeddings, expected)
    if training:
        for got, want in zip(embeddings.branch_outputs[:2], expected.branch_outputs[:2]):
            assert torch.equal(got, want)


@pytest.mark.parametrize("where", ["both", "head_only", "loss_only"])
@pytest.mark.parametrize("context", CONTEXTS)
def test_the_drml_loss_gives_its_grad_mode_value_then_trains(context, where):
    """The head and the loss inside the context, only the head (the loss computed after it,
    with grad), or only the loss; then training steps match a twin that never saw it."""
    embedder, loss_fn = make_drml()
    ref_embedder, ref_loss = copy.deepcopy(embedder), copy.deepcopy(loss_fn)
    x = inputs(size=IN_FEATURES)
    expected = ref_loss(ref_embedder(x), LABELS)
    with CONTEXTS[context]():
        embeddings = embedder(x) if where != "loss_only" else None
        value = loss_fn(embeddings, LABELS) if where == "both" else None
    if where == "loss_only":
        embeddings = embedder(x)
        with CONTEXTS[context]():
            value = loss_fn(embeddings, LABELS)
    elif where == "head_only":
        value = loss_fn(embeddings, LABELS)
    assert torch.equal(value, expected)
    assert_no_inference_state(embedder, loss_fn)
    for _ in range(2):
        got, want = training_step(loss_fn, x, embedder), training_step(ref_loss, x, ref_embedder)
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("context", CONTEXTS)
def test_cross_batch_memory_under_inference_mode_then_training(context, dtype):
    """The memory is cast to the batch's dtype (float64 here) inside the context: it must stay
    an ordinary buffer, which later training steps update in place."""
    torch.manual_seed(0)
    loss_fn = losses.CrossBatchMemoryWithClassWiseMultiSimilarity(
        losses.ClassWiseMultiSimilarityLoss(), D, memory_size=20
    )
    reference = copy.deepcopy(loss_fn)
    x = inputs(dtype)
    expected = reference(x, LABELS)
    with CONTEXTS[context]():
        value = loss_fn(x, LABELS)
    assert torch.equal(value, expected)
    assert_no_inference_state(loss_fn)
    assert torch.equal(
        training_step(loss_fn, inputs(dtype, seed=1)), training_step(reference, inputs(dtype, seed=1))
    )
    assert torch.equal(loss_fn.embedding_memory, reference.embedding_memory)
    with torch.inference_mode():
        loss_fn.reset_queue()
    assert_no_inference_state(loss_fn)
    training_step(loss_fn, inputs(dtype, seed=2))

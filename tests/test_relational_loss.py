"""RelationalLoss against a loop-built composition of its base losses (docs/models.md)."""

import copy
import io

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners, reducers, regularizers, testers
from pytorch_metric_learning.losses import BaseMetricLossFunction

from pml_fieldlosses.losses import MeanFieldContrastiveLoss, relational_loss
from pml_fieldlosses.losses.relational_loss import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder, branch_outputs_of

from .helpers import DTYPES, assert_close
from .naive_relational import naive_relational_loss

IN_FEATURES, EMBEDDING_SIZE, K, NUM_CLASSES = 12, 9, 3, 4
LABELS = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 0, 1]


def make_embedder(dtype=torch.float32, seed=0, integrator_noise=0.3):
    """An embedder whose integrator has moved away from [I | 0], so every path matters."""
    torch.manual_seed(seed)
    embedder = RelationalEmbedder(IN_FEATURES, EMBEDDING_SIZE, K)
    with torch.no_grad():
        embedder.integrator.weight.add_(integrator_noise * torch.randn_like(embedder.integrator.weight))
        embedder.decoders.weight.mul_(0.3)
    return embedder.to(dtype)


E = EMBEDDING_SIZE // K
LOSS_CASES = {
    "ProxyAnchor": lambda: dict(
        base_loss=pml_losses.ProxyAnchorLoss(NUM_CLASSES, EMBEDDING_SIZE, margin=0.2, alpha=8),
        branch_losses=lambda: pml_losses.ProxyAnchorLoss(NUM_CLASSES, E, margin=0.2, alpha=8),
        num_branches=K,
        embedding_size=EMBEDDING_SIZE,
        representation_weight=10.0,
    ),
    "MeanFieldContrastive": lambda: dict(
        base_loss=MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE, pos_margin=0.1, neg_margin=0.9),
        branch_losses=[
            MeanFieldContrastiveLoss(NUM_CLASSES, E, pos_margin=0.1, neg_margin=0.9) for _ in range(K)
        ],
        num_branches=K,
        reconstruction_weight=2.0,
    ),
    "MultiSimilarity_default_branches": lambda: dict(
        base_loss=pml_losses.MultiSimilarityLoss(alpha=2, beta=10),
        num_branches=K,
        embedding_size=EMBEDDING_SIZE,
    ),
    "CosFace_template_branch_loss": lambda: dict(
        base_loss=pml_losses.CosFaceLoss(NUM_CLASSES, EMBEDDING_SIZE, scale=8),
        branch_losses=pml_losses.CosFaceLoss(NUM_CLASSES, E, scale=8),
        num_branches=K,
        representation_weight=0.5,
    ),
    "CosFace_shared_branch_loss": lambda: dict(
        base_loss=pml_losses.CosFaceLoss(NUM_CLASSES, EMBEDDING_SIZE, scale=8),
        branch_losses=[pml_losses.CosFaceLoss(NUM_CLASSES, E, scale=8)] * K,
        num_branches=K,
        representation_weight=0.5,
    ),
}


def features_and_labels(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(len(LABELS), IN_FEATURES, generator=g, dtype=torch.float64).to(dtype)
    return features.requires_grad_(), torch.tensor(LABELS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", LOSS_CASES)
def test_loss_and_gradients_match_loop_composition(case, dtype):
    if dtype in (torch.float16, torch.bfloat16):  # TEST_DTYPES=float16 on a GPU
        pytest.skip("the head trains with float32/float64 parameters (half precision: autocast)")
    embedder = make_embedder(dtype)
    loss_fn = RelationalLoss(**LOSS_CASES[case]()).to(dtype)
    features, labels = features_and_labels(dtype)
    embeddings = embedder(features)
    loss = loss_fn(embeddings, labels)
    inputs = [features] + list(embedder.parameters()) + list(loss_fn.parameters())
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)

    embeddings = embedder(features)
    nodes, errors, _ = branch_outputs_of(embeddings)
    expected = naive_relational_loss(loss_fn, embeddings, nodes, errors, labels)
    expected_grads = torch.autograd.grad(expected, inputs, allow_unused=True)
    assert loss.dtype == dtype
    assert_close(loss, expected, dtype)
    for grad, expected_grad in zip(grads, expected_grads):
        assert (grad is None) == (expected_grad is None)
        if grad is not None:
            assert_close(grad, expected_grad, dtype)


def parameter_groups(embedder, loss_fn):
    groups = {
        name: list(getattr(embedder, name).parameters())
        for name in ["nodes", "a_edges", "b_edges", "score", "integrator", "decoders"]
    }
    groups["base_loss"] = list(loss_fn.base_loss.parameters())
    groups["branch_losses"] = list(loss_fn.branch_losses.parameters())
    return groups


def receives_gradient(term, features, params):
    grads = torch.autograd.grad(term, [features] + params, retain_graph=True, allow_unused=True)
    return [g is not None and bool(g.abs().sum() > 0) for g in grads]


ROUTING = {
    "branch_loss": {"features", "nodes", "branch_losses"},
    "representation_loss": {"features", "nodes", "a_edges", "b_edges", "score", "integrator", "base_loss"},
    "reconstruction_loss": {"decoders"},
}


@pytest.mark.parametrize("term", ROUTING)
def test_gradient_routing_of_each_term(term):
    embedder = make_embedder(torch.float64)
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]()).double()
    features, labels = features_and_labels(torch.float64)
    embeddings = embedder(features)
    value = loss_fn.compute_loss(embeddings, labels, None, embeddings, labels)[term]["losses"]
    (features_gets,) = receives_gradient(value, features, [])
    assert features_gets == ("features" in ROUTING[term])
    for name, params in parameter_groups(embedder, loss_fn).items():
        gets = receives_gradient(value, features, params)[1:]
        assert all(gets) if name in ROUTING[term] else not any(gets), (term, name, gets)


def test_edges_and_score_get_no_gradient_at_initialisation():
    torch.manual_seed(0)
    embedder = RelationalEmbedder(IN_FEATURES, EMBEDDING_SIZE, K)  # integrator [I | 0]
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    features, labels = features_and_labels(torch.float32)
    loss_fn(embedder(features), labels).backward()
    for layer in [embedder.a_edges, embedder.b_edges, embedder.score]:
        for p in layer.parameters():
            assert p.grad is None or not p.grad.any()
    assert embedder.integrator.weight.grad[:, E:].abs().sum() > 0  # the right block starts moving


def test_trunk_gets_nothing_through_the_edges():
    # with node weights 0 the nodes do not depend on the features: the only
    # remaining paths from the features are the (detached) edges and decoders
    embedder = make_embedder(torch.float64)
    with torch.no_grad():
        embedder.nodes.weight.zero_()
        embedder.nodes.bias.normal_()
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]()).double()
    features, labels = features_and_labels(torch.float64)
    loss = loss_fn(embedder(features), labels)
    (grad,) = torch.autograd.grad(loss, [features], allow_unused=True)
    assert grad is None or not grad.any()


class RecordingLoss(BaseMetricLossFunction):
    """Returns the sum of its embeddings and records what it was called with."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        self.calls.append((embeddings.detach().clone(), labels.clone(), indices_tuple))
        return {"loss": {"losses": embeddings.sum(), "indices": None, "reduction_type": "already_reduced"}}


def test_assignment_ties_and_empty_branch():
    # n_in = 1 and decoders that output 0: the error of branch k is h_k ** 2
    torch.manual_seed(0)
    embedder = RelationalEmbedder(3, 3, 3)
    with torch.no_grad():
        embedder.decoders.weight.zero_()
        embedder.decoders.bias.zero_()
    branch_losses = [RecordingLoss() for _ in range(3)]
    loss_fn = RelationalLoss(
        RecordingLoss(),
        branch_losses,
        num_branches=3,
        representation_weight=0,
        reconstruction_weight=0,
        collect_stats=True,
    )
    features = torch.tensor([[1.0, 2, 3], [2, 1, 3], [-1, 1, 3], [2, 2, -2], [3, 1, -1]])
    labels = torch.tensor([0, 1, 2, 3, 4])
    # errors: [1,4,9] -> 0; [4,1,9] -> 1; [1,1,9] tie -> 0; [4,4,4] tie -> 0; [9,1,1] tie -> 1; branch 2 empty
    embeddings = embedder(features)
    nodes = branch_outputs_of(embeddings).nodes
    loss = loss_fn(embeddings, labels)
    members = {0: [0, 2, 3], 1: [1, 4], 2: []}
    for k, recorder in enumerate(branch_losses):
        if not members[k]:
            assert recorder.calls == []
            continue
        ((received, received_labels, _),) = recorder.calls
        torch.testing.assert_close(received, nodes[members[k], k].detach())
        assert received_labels.tolist() == members[k]
    torch.testing.assert_close(loss, nodes[[0, 2, 3], 0].sum() + nodes[[1, 4], 1].sum())
    assert [loss_fn.num_samples_branch_0, loss_fn.num_samples_branch_1, loss_fn.num_samples_branch_2] == [
        3,
        2,
        0,
    ]


def test_all_samples_in_one_branch_and_batch_size_one():
    embedder = make_embedder()
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    features, labels = features_and_labels(torch.float32)
    for x, y in [(features[:1], labels[:1]), (features[:4], labels[:4])]:
        with torch.no_grad():  # make branch 1 reconstruct best for every sample
            embedder.decoders.weight[1].zero_()
            embedder.decoders.bias.fill_(100.0)
            embedder.decoders.bias[1].zero_()
        embeddings = embedder(x)
        nodes, errors, _ = branch_outputs_of(embeddings)
        assert errors.argmin(dim=1).eq(1).all()
        loss = loss_fn(embeddings, y)
        assert_close(loss, naive_relational_loss(loss_fn, embeddings, nodes, errors, y), torch.float32)
        loss.backward()


def miner_cases():
    return {
        "triplets": (pml_losses.TripletMarginLoss(margin=0.5), miners.TripletMarginMiner(margin=2.0)),
        "pairs": (
            pml_losses.ContrastiveLoss(pos_margin=0.2, neg_margin=0.8),
            miners.PairMarginMiner(pos_margin=0.3, neg_margin=0.9),
        ),
    }


@pytest.mark.parametrize("case", ["triplets", "pairs"])
@pytest.mark.parametrize("on", ["embeddings", "branch_nodes"])
def test_miner_tuples(case, on):
    base_loss, miner = miner_cases()[case]
    embedder = make_embedder(torch.float64)
    branch_miner = miner if on == "branch_nodes" else None
    loss_fn = RelationalLoss(base_loss, branch_miner=branch_miner, num_branches=K).double()
    features, labels = features_and_labels(torch.float64)
    embeddings = embedder(features)
    indices_tuple = miner(embeddings, labels)
    assert len(indices_tuple[0]) > 0
    loss = loss_fn(embeddings, labels, indices_tuple)
    nodes, errors, _ = branch_outputs_of(embeddings)
    expected = naive_relational_loss(loss_fn, embeddings, nodes, errors, labels, indices_tuple, branch_miner)
    assert_close(loss, expected, torch.float64)
    inputs = [features] + list(embedder.parameters())
    for grad, expected_grad in zip(
        torch.autograd.grad(loss, inputs, retain_graph=True, allow_unused=True),
        torch.autograd.grad(expected, inputs, allow_unused=True),
    ):
        if expected_grad is not None:
            assert_close(grad, expected_grad, torch.float64)


def test_several_forwards_and_eval_forwards_before_the_loss():
    embedder = make_embedder()
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    fresh_embedder, fresh_loss = copy.deepcopy((embedder, loss_fn))
    features, labels = features_and_labels(torch.float32)
    batches = [(features[:7], labels[:7]), (features[7:], labels[7:]), (features, labels)]
    expected = [fresh_loss(fresh_embedder(x), y) for x, y in batches]

    outputs = [embedder(x) for x, _ in batches]
    embedder.eval()
    eval_outputs = embedder(features)
    assert not hasattr(eval_outputs, "branch_outputs")
    tester = testers.BaseTester(dataloader_num_workers=0, data_device=torch.device("cpu"))
    dataset = torch.utils.data.TensorDataset(features.detach(), labels)
    tester.get_all_embeddings(dataset, torch.nn.Identity(), embedder)
    embedder.train()
    for (_, y), embeddings, value in reversed(list(zip(batches, outputs, expected))):
        assert_close(loss_fn(embeddings, y), value, torch.float32)
    with pytest.raises(RuntimeError, match="carry no branch outputs"):
        loss_fn(eval_outputs, labels)


def gathered_like_ddp(embeddings, labels, monkeypatch):
    """What PML's DistributedLossWrapper hands the loss on 2 ranks: PML's own
    ``distributed.gather`` with the other rank's batch (here a copy of this one) in
    place of the process group's all_gather."""
    from pytorch_metric_learning.utils import distributed as pml_distributed

    monkeypatch.setattr(
        pml_distributed, "all_gather_embeddings_and_labels", lambda e, y: (e.detach().clone(), y.clone())
    )
    all_embeddings, all_labels, _ = pml_distributed.gather(embeddings, labels)
    return all_embeddings, all_labels


def test_errors_for_tensors_other_than_the_training_output(monkeypatch):
    embedder = make_embedder()
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    features, labels = features_and_labels(torch.float32)
    with pytest.raises(RuntimeError, match="carry no branch outputs .* training-mode forward"):
        loss_fn(torch.randn(len(LABELS), EMBEDDING_SIZE), labels)
    embeddings = embedder(features)
    for modified, modified_labels in [
        (embeddings.clone(), labels),
        (embeddings * 1.0, labels),
        (torch.nn.functional.normalize(embeddings), labels),
        (embeddings.detach(), labels),
        (embeddings[:5], labels[:5]),
        (embeddings.double(), labels),
        (embeddings.to(torch.bfloat16), labels),
        gathered_like_ddp(embeddings, labels, monkeypatch),
    ]:
        with pytest.raises(RuntimeError, match="carry no branch outputs"):
            loss_fn(modified, modified_labels)
    # no-op casts return the tensor itself (branch outputs included)
    assert embeddings.float() is embeddings and embeddings.to("cpu") is embeddings
    with pytest.raises(ValueError, match="does not support ref_emb"):
        loss_fn(embeddings, labels, ref_emb=embeddings.detach(), ref_labels=labels)
    with pytest.raises(ValueError, match="labels are required"):
        loss_fn(embeddings)
    with pytest.raises(ValueError, match="dimension 8"):
        loss_fn(torch.randn(3, 8), labels[:3])
    value = loss_fn(embeddings, labels)  # the failed calls disturbed nothing
    nodes, errors, _ = branch_outputs_of(embeddings)
    assert_close(value, naive_relational_loss(loss_fn, embeddings, nodes, errors, labels), torch.float32)
    with torch.no_grad():  # an in-place change makes the branch outputs stale
        embeddings.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        loss_fn(embeddings, labels)


def test_head_and_loss_must_agree_on_the_branches():
    torch.manual_seed(0)
    for head, match in [
        (RelationalEmbedder(IN_FEATURES, EMBEDDING_SIZE, 1), "with 1 branches of size 9"),
        (RelationalEmbedder(IN_FEATURES, 6, 3), "dimension 6, but the loss was built with embedding_size=9"),
    ]:
        loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
        with pytest.raises(ValueError, match=match):
            loss_fn(head(torch.randn(4, IN_FEATURES)), torch.tensor([0, 1, 2, 3]))
    # sizes unknown at construction (a base loss without embedding_size): checked at the call
    loss_fn = RelationalLoss(
        pml_losses.TripletMarginLoss(), lambda: MeanFieldContrastiveLoss(4, 5), num_branches=K
    )
    with pytest.raises(ValueError, match=r"branch_losses\[0\] was built with embedding_size=5, .* size 3"):
        loss_fn(make_embedder()(torch.randn(4, IN_FEATURES)), torch.tensor([0, 1, 2, 3]))


SHARED_PROXY_ANCHOR = pml_losses.ProxyAnchorLoss(NUM_CLASSES, EMBEDDING_SIZE)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(base_loss=pml_losses.ProxyAnchorLoss(4, 9)),
            ValueError,
            "has parameters or buffers sized for the full",
        ),
        (
            dict(
                base_loss=pml_losses.TripletMarginLoss(), branch_losses=[pml_losses.TripletMarginLoss()] * 2
            ),
            ValueError,
            "2 entries, expected num_branches=3",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), branch_losses="triplet"),
            TypeError,
            "branch_losses must be",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), branch_losses=lambda: 3),
            TypeError,
            r"branch_losses\[0\] must be a loss module",
        ),
        (
            dict(
                base_loss=MeanFieldContrastiveLoss(4, 9), branch_losses=lambda: MeanFieldContrastiveLoss(4, 9)
            ),
            ValueError,
            r"branch_losses\[0\] was built with embedding_size=9, but it receives embeddings of size 3",
        ),
        (dict(base_loss=torch.nn.functional.mse_loss), TypeError, "base_loss must be a loss module"),
        (
            dict(base_loss=SHARED_PROXY_ANCHOR, branch_losses=[SHARED_PROXY_ANCHOR] * K),
            ValueError,
            r"branch_losses\[0\] shares parameters with base_loss",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), representation_weight=-1),
            ValueError,
            "representation_weight must be >= 0",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), reconstruction_weight=float("nan")),
            ValueError,
            "reconstruction_weight must be >= 0",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), representation_weight=float("inf")),
            ValueError,
            "representation_weight must be",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), distance=None),
            ValueError,
            "set the distance on base_loss",
        ),
        (dict(base_loss=pml_losses.TripletMarginLoss(), num_branches=0), ValueError, "num_branches must"),
        (dict(base_loss=pml_losses.TripletMarginLoss(), num_branches=2.0), ValueError, "num_branches must"),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), embedding_size=10),
            ValueError,
            "embedding_size=10 must be divisible by num_branches=3",
        ),
        (
            dict(base_loss=pml_losses.TripletMarginLoss(), embedding_size=-3),
            ValueError,
            "embedding_size must be a positive integer",
        ),
        (
            dict(base_loss=MeanFieldContrastiveLoss(4, 9), embedding_size=12),
            ValueError,
            "base_loss was built with embedding_size=9, but it receives embeddings of size 12",
        ),
    ],
)
def test_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        RelationalLoss(**{"num_branches": K, **kwargs})


def test_data_parallel_on_one_device_passes_the_output_through():
    embedder = make_embedder()
    wrapped = torch.nn.DataParallel(embedder)  # on CPU / one GPU it calls the module directly
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    features, labels = features_and_labels(torch.float32)
    embeddings = wrapped(features)
    nodes, errors, _ = branch_outputs_of(embeddings)
    expected = naive_relational_loss(loss_fn, embeddings, nodes, errors, labels)
    assert_close(loss_fn(embeddings, labels), expected, torch.float32)


def test_takes_no_embedder():
    for args, kwargs in [
        ((make_embedder(), pml_losses.TripletMarginLoss()), {}),
        ((pml_losses.TripletMarginLoss(),), {"embedder": make_embedder()}),
    ]:
        with pytest.raises(TypeError, match="takes no embedder .* num_branches=embedder.num_branches"):
            RelationalLoss(*args, **kwargs)


def test_parameters_state_dict_and_records():
    embedder = make_embedder()
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    params = list(loss_fn.parameters())
    assert len(params) == 1 + K  # the base loss's and each branch loss's proxies, none of the embedder's
    assert {p.shape for p in params} == {(NUM_CLASSES, EMBEDDING_SIZE), (NUM_CLASSES, E)}
    assert not {id(p) for p in params} & {id(p) for p in embedder.parameters()}
    assert set(loss_fn._record_these) >= {"num_branches", "representation_weight", "reconstruction_weight"}

    buffer = io.BytesIO()
    torch.save(loss_fn.state_dict(), buffer)
    restored = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    restored.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    features, labels = features_and_labels(torch.float32)
    embeddings = embedder(features)
    torch.testing.assert_close(restored(embeddings, labels), loss_fn(embeddings, labels))

    shared = RelationalLoss(**LOSS_CASES["CosFace_shared_branch_loss"]())
    assert len(list(shared.parameters())) == 2
    template = RelationalLoss(**LOSS_CASES["CosFace_template_branch_loss"]())
    copies = [template.branch_loss_of(k).W for k in range(K)]
    assert len(list(template.parameters())) == 1 + K and len({id(w) for w in copies}) == K
    assert all(torch.equal(w, copies[0]) for w in copies)  # each branch starts from the template's values
    default = RelationalLoss(pml_losses.TripletMarginLoss(), num_branches=K)
    assert all(loss is default.base_loss for loss in default.branch_losses.values())


def test_bfloat16_autocast():
    embedder = make_embedder()
    loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"]())
    features, labels = features_and_labels(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = embedder(features)
        loss = loss_fn(embeddings, labels)
    assert embeddings.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert torch.isfinite(loss)
    loss.backward()
    for p in list(embedder.parameters()) + list(loss_fn.parameters()):
        assert p.dtype == torch.float32 and (p.grad is None or torch.isfinite(p.grad).all())


@pytest.mark.parametrize(
    "weights, match",
    [
        (dict(representation_weight=1e38), r"representation_loss is inf: representation_weight=1e\+38 times"),
        (dict(reconstruction_weight=1e38), r"reconstruction_loss is inf: reconstruction_weight=1e\+38 times"),
    ],
    ids=["representation", "reconstruction"],
)
def test_a_term_that_overflows_is_our_error(weights, match):
    """Finite weights whose product with the term overflows float32: a clear error, not inf."""
    embedder = make_embedder()
    kwargs = {**LOSS_CASES["ProxyAnchor"](), **weights}
    loss_fn = RelationalLoss(**kwargs)
    features, labels = features_and_labels(torch.float32)
    with pytest.raises(ValueError, match=match):
        loss_fn(embedder(features * 100), labels)


class NaNLoss(BaseMetricLossFunction):
    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        value = embeddings.sum() * float("nan")
        return {"loss": {"losses": value, "indices": None, "reduction_type": "already_reduced"}}


def test_a_branch_loss_returning_nan_is_our_error():
    loss_fn = RelationalLoss(pml_losses.TripletMarginLoss(), NaNLoss(), num_branches=K)
    features, labels = features_and_labels(torch.float32)
    with pytest.raises(ValueError, match="branch_loss is nan: one of the branch losses"):
        loss_fn(make_embedder()(features), labels)


class ConstantLoss(BaseMetricLossFunction):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        value = embeddings.sum() * 0 + self.value
        return {"loss": {"losses": value, "indices": None, "reduction_type": "already_reduced"}}


def test_finite_terms_whose_sum_overflows_are_our_error():
    torch.manual_seed(0)
    embedder = RelationalEmbedder(IN_FEATURES, EMBEDDING_SIZE, 1)
    loss_fn = RelationalLoss(
        ConstantLoss(1.0), [ConstantLoss(2e38)], num_branches=1, representation_weight=2e38
    )
    features, labels = features_and_labels(torch.float32)
    with pytest.raises(
        ValueError, match=r"sum of its finite terms overflows torch.float32 \(branch_loss=2e\+38"
    ):
        loss_fn(embedder(features), labels)


@pytest.mark.parametrize("label_dtype", [torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("case", LOSS_CASES)
def test_labels_of_every_integer_dtype(case, label_dtype):
    """Labels of any integer dtype give the int64 result (PML's ProxyAnchorLoss alone fails
    deep inside torch on int32 labels: one_hot needs int64)."""
    embedder = make_embedder()
    features, labels = features_and_labels(torch.float32)
    torch.manual_seed(0)
    expected = RelationalLoss(**LOSS_CASES[case]())(embedder(features), labels)
    torch.manual_seed(0)
    loss = RelationalLoss(**LOSS_CASES[case]())(embedder(features), labels.to(label_dtype))
    torch.testing.assert_close(loss, expected)


class CountingReducer(reducers.MeanReducer):
    """A MeanReducer subclass: RelationalLoss must call it (no shortcut for reducers it does not know)."""

    calls = 0

    def forward(self, *args, **kwargs):
        CountingReducer.calls += 1
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "reducer", ["default", "MeanReducer", "collect_stats", "subclass", "AvgNonZeroReducer", "regularizer"]
)
def test_the_sum_of_the_terms_is_the_reducers_bit_for_bit(reducer, dtype, monkeypatch):
    """With PML's default reducer for the three terms, RelationalLoss sums them without calling
    it: the value and every gradient must be bit for bit those of the reducer's call, and any
    other reducer (or a term it must reduce itself) must still be called."""
    if dtype in (torch.float16, torch.bfloat16):  # TEST_DTYPES=float16 on a GPU
        pytest.skip("the head trains with float32/float64 parameters (half precision: autocast)")
    kwargs = {
        "default": {},
        "MeanReducer": {"reducer": reducers.MeanReducer()},
        "collect_stats": {"reducer": reducers.MeanReducer(collect_stats=True)},
        "subclass": {"reducer": CountingReducer()},
        "AvgNonZeroReducer": {"reducer": reducers.AvgNonZeroReducer()},
        "regularizer": {"embedding_regularizer": regularizers.LpRegularizer()},
    }[reducer]
    reduced = []
    forward = reducers.MultipleReducers.forward
    monkeypatch.setattr(reducers.MultipleReducers, "forward", lambda *a: reduced.append(1) or forward(*a))
    results = []
    for shortcut in (True, False):
        if not shortcut:  # the reducer called as PML calls it
            monkeypatch.setattr(relational_loss, "reduce_terms", lambda r, terms, x, y: r(terms, x, y))
        embedder = make_embedder(dtype)
        loss_fn = RelationalLoss(**LOSS_CASES["ProxyAnchor"](), **kwargs).to(dtype)
        generator = torch.Generator().manual_seed(1)
        features = torch.randn(len(LABELS), IN_FEATURES, dtype=dtype, generator=generator)
        calls = CountingReducer.calls
        loss = loss_fn(embedder(features), torch.tensor(LABELS))
        if reducer == "subclass":
            assert CountingReducer.calls > calls
        # the shortcut is taken for PML's default reducers only (an embedding regularizer's
        # term comes already reduced, by the regularizer's own reducer)
        assert bool(reduced) == (not shortcut or reducer not in ("default", "MeanReducer", "regularizer"))
        reduced.clear()
        if reducer == "collect_stats":
            assert loss_fn.reducer.reducers["branch_loss"].losses_size == 1
        params = [*embedder.parameters(), *loss_fn.parameters()]
        results.append((loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)))
    (value, grads), (expected_value, expected_grads) = results
    assert torch.equal(value, expected_value)
    for got, expected in zip(grads, expected_grads):
        assert (got is None and expected is None) or torch.equal(got, expected)

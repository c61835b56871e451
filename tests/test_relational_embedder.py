"""RelationalEmbedder against hand-computed values and a naive loop reference (docs/derivations.md, 'The relational head (DRML)')."""

import copy
import io
import pickle
import weakref

import pytest
import torch

from pml_fieldlosses.models import BranchOutputs, RelationalEmbedder, branch_outputs_of

from .helpers import DTYPES, assert_close
from .naive import nrm

ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
HALF = (torch.float16, torch.bfloat16)


def skip_half_training(dtype):
    if dtype in HALF:  # TEST_DTYPES=float16 on a GPU
        pytest.skip("a half-precision head is for inference only; see test_every_dtype_pair_*")


def naive_forward(module, features):
    """The forward (docs/derivations.md, 'Forward') with explicit loops over samples and branches, from the module's
    parameters (branch k of a BranchLinear is weight[k], bias[k]).
    Returns embeddings (B, K*E), nodes (B, K, E), errors (B, K)."""
    K, n_in = module.num_branches, module.branch_in_features
    w_s, b_s = module.score.weight[0], module.score.bias[0]
    W_int, b_int = module.integrator.weight, module.integrator.bias

    def linear(layer, k, x):
        return layer.weight[k] @ x + layer.bias[k]

    all_embeddings, all_nodes, all_errors = [], [], []
    for b in range(len(features)):
        h = [features[b, k * n_in : (k + 1) * n_in] for k in range(K)]
        n = [nrm(linear(module.nodes, k, h[k])) for k in range(K)]
        a = [linear(module.a_edges, k, h[k].detach()) for k in range(K)]
        bb = [linear(module.b_edges, k, h[k].detach()) for k in range(K)]
        errors = []
        for k in range(K):
            r = linear(module.decoders, k, n[k].detach())
            errors.append(torch.mean((h[k].detach() - r) ** 2))
        score = [[torch.relu(torch.dot(w_s, a[i] - bb[j]) + b_s) for j in range(K)] for i in range(K)]
        outputs = []
        for j in range(K):
            column = sum(score[i][j] for i in range(K))
            message = sum(score[i][j] / torch.clamp(column, min=1e-12) * n[i] for i in range(K))
            outputs.append(W_int @ torch.cat([n[j], message]) + b_int)
        all_embeddings.append(torch.cat(outputs))
        all_nodes.append(torch.stack(n))
        all_errors.append(torch.stack(errors))
    return torch.stack(all_embeddings), torch.stack(all_nodes), torch.stack(all_errors)


def randomize(module, generator, integrator_scale=0.5):
    """Random parameters everywhere (the integrator too), so every path matters."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
        module.integrator.weight.mul_(integrator_scale)


def make_module(in_features=12, embedding_size=6, num_branches=3, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return RelationalEmbedder(in_features, embedding_size, num_branches).to(dtype)


def test_output_at_initialisation_is_the_concatenated_normalised_nodes():
    module = make_module(in_features=32, embedding_size=16, num_branches=4)
    features = torch.randn(9, 32)
    expected = torch.cat(
        [
            torch.nn.functional.normalize(
                torch.nn.functional.linear(chunk, module.nodes.weight[k], module.nodes.bias[k]), dim=1
            )
            for k, chunk in enumerate(features.chunk(4, dim=1))
        ],
        dim=1,
    )
    for training in [True, False]:
        module.train(training)
        torch.testing.assert_close(module(features), expected)
    E = module.branch_size
    torch.testing.assert_close(module.integrator.weight, torch.cat([torch.eye(E), torch.zeros(E, E)], dim=1))
    assert not module.integrator.bias.any() and not module.score.bias.any()
    for layer in [module.nodes, module.a_edges, module.b_edges, module.decoders]:
        assert not layer.bias.any()


# Hand-computed, K=2, n_in=E=2, identity node/edge/decoder weights, zero biases,
# w_s=(1, 0), integrator [I | I], h=[3, 4 | 0, 2]: n_1=(0.6, 0.8), n_2=(0, 1),
# score_ij = relu(h_i[0] - h_j[0] + b_s) with h_1[0]=3, h_2[0]=0.
#   b_s=1: scores [[1, 4], [0, 1]]; column 1 -> A=(1, 0), u_1=n_1; column 2 -> A=(0.8, 0.2),
#          u_2=(0.48, 0.84); o_1=n_1+u_1=(1.2, 1.6), o_2=n_2+u_2=(0.48, 1.84)
#   b_s=0: scores [[0, 3], [0, 0]]; column 1 all zero -> u_1=0; column 2 -> A=(1, 0), u_2=n_1;
#          o_1=(0.6, 0.8), o_2=(0.6, 1.8)
# reconstruction r_k = n_k: e_1 = ((3-0.6)^2 + (4-0.8)^2)/2 = 8, e_2 = (0 + (2-1)^2)/2 = 0.5
@pytest.mark.parametrize(
    "score_bias, expected",
    [(1.0, [1.2, 1.6, 0.48, 1.84]), (0.0, [0.6, 0.8, 0.6, 1.8])],
    ids=["bias1", "bias0"],
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hand_computed_forward(score_bias, expected, dtype):
    skip_half_training(dtype)
    module = make_module(4, 4, 2, dtype)
    with torch.no_grad():
        for layer in [module.nodes, module.a_edges, module.b_edges, module.decoders]:
            layer.weight.copy_(torch.eye(2).expand(2, 2, 2))
            layer.bias.zero_()
        module.score.weight.copy_(torch.tensor([[1.0, 0.0]]))
        module.score.bias.fill_(score_bias)
        module.integrator.weight.copy_(torch.cat([torch.eye(2), torch.eye(2)], dim=1))
        module.integrator.bias.zero_()
    features = torch.tensor([[3.0, 4.0, 0.0, 2.0]], dtype=dtype)
    embeddings = module(features)
    assert_close(embeddings, torch.tensor([expected], dtype=torch.float64), dtype)
    outputs = branch_outputs_of(embeddings)
    assert_close(outputs.nodes, torch.tensor([[[0.6, 0.8], [0.0, 1.0]]], dtype=torch.float64), dtype)
    assert_close(outputs.errors, torch.tensor([[8.0, 0.5]], dtype=torch.float64), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("integrator", ["random", "messages_only"])
def test_forward_and_gradients_match_naive_loops(dtype, integrator):
    skip_half_training(dtype)
    g = torch.Generator().manual_seed(3)
    module = make_module(12, 6, 3, dtype)
    randomize(module, g)
    if integrator == "messages_only":  # [0 | I]: the output is the messages u_j themselves
        with torch.no_grad():
            module.integrator.weight.copy_(torch.cat([torch.zeros(2, 2), torch.eye(2)], dim=1))
            module.integrator.bias.zero_()
    features = torch.randn(7, 12, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    embeddings = module(features)
    outputs = branch_outputs_of(embeddings)
    expected, expected_nodes, expected_errors = naive_forward(module, features)
    assert_close(embeddings, expected, dtype)
    assert_close(outputs.nodes, expected_nodes, dtype)
    assert_close(outputs.errors, expected_errors, dtype)

    # gradients of a random linear function of each output w.r.t. features and every parameter
    inputs = [features] + list(module.parameters())
    for actual, reference in [
        (embeddings, expected),
        (outputs.nodes, expected_nodes),
        (outputs.errors, expected_errors),
    ]:
        weights = torch.randn(actual.shape, generator=g, dtype=torch.float64).to(dtype)
        grads = torch.autograd.grad((actual * weights).sum(), inputs, retain_graph=True, allow_unused=True)
        expected_grads = torch.autograd.grad(
            (reference * weights).sum(), inputs, retain_graph=True, allow_unused=True
        )
        for grad, expected_grad in zip(grads, expected_grads):
            assert (grad is None) == (expected_grad is None)
            if grad is not None:
                assert_close(grad, expected_grad, dtype)


def test_zero_score_columns_give_zero_messages():
    module = make_module(8, 4, 2)
    with torch.no_grad():
        module.score.weight.zero_()
        module.score.bias.fill_(-1.0)  # every score relu(-1) = 0
        module.integrator.weight.copy_(torch.cat([torch.zeros(2, 2), torch.eye(2)], dim=1))
    embeddings = module(torch.randn(5, 8))
    assert torch.equal(embeddings, torch.zeros(5, 4))


def test_batch_size_one():
    module = make_module(12, 6, 3)
    randomize(module, torch.Generator().manual_seed(0))
    features = torch.randn(1, 12, dtype=torch.float64).float()
    for training in [True, False]:
        module.train(training)
        embeddings = module(features)
        assert embeddings.shape == (1, 6)
        assert_close(embeddings, naive_forward(module, features)[0], torch.float32)
    module.train()
    outputs = branch_outputs_of(module(features))
    assert outputs.nodes.shape == (1, 3, 2) and outputs.errors.shape == (1, 3)


def test_eval_mode_is_a_plain_function_and_attaches_nothing():
    module = make_module().eval()
    features = torch.randn(4, 12)
    embeddings = module(features)
    assert not hasattr(embeddings, "branch_outputs")
    with pytest.raises(RuntimeError, match="carry no branch outputs"):
        branch_outputs_of(embeddings)
    module.train()
    torch.testing.assert_close(module(features), embeddings)


def test_branch_outputs_travel_with_the_output_and_go_with_it():
    module = make_module()
    features = torch.randn(5, 12)
    embeddings = module(features)
    outputs = embeddings.branch_outputs
    assert isinstance(outputs, BranchOutputs) and branch_outputs_of(embeddings) is outputs
    assert outputs.nodes.shape == (5, 3, 2) and outputs.errors.shape == (5, 3)
    assert outputs.version == embeddings._version
    other = module(features[:2])
    assert branch_outputs_of(other).nodes.shape[0] == 2 and branch_outputs_of(embeddings) is outputs
    watched = weakref.ref(outputs.nodes)
    del embeddings, outputs
    assert watched() is None  # no cache: the outputs live exactly as long as the embeddings
    for copy_of in [torch.Tensor.clone, torch.Tensor.detach, torch.Tensor.double, lambda t: t[1:]]:
        with pytest.raises(RuntimeError, match="carry no branch outputs"):
            branch_outputs_of(copy_of(other))


def test_state_dict_round_trip():
    g = torch.Generator().manual_seed(1)
    module = make_module(12, 6, 3)
    randomize(module, g)
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    restored = make_module(12, 6, 3, seed=5)
    restored.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    features = torch.randn(5, 12, generator=g)
    for training in [True, False]:
        module.train(training)
        restored.train(training)
        torch.testing.assert_close(restored(features), module(features))
    assert sorted(module.state_dict()) == sorted(
        f"{layer}.{p}"
        for layer in ["nodes", "a_edges", "b_edges", "decoders", "score", "integrator"]
        for p in ["weight", "bias"]
    )


def test_copy_and_pickle_mid_step():
    module = make_module()
    embeddings = module(torch.randn(3, 12))
    for clone in [copy.deepcopy(module), pickle.loads(pickle.dumps(module))]:
        torch.testing.assert_close(clone.eval()(torch.ones(2, 12)), module.eval()(torch.ones(2, 12)))
    branch_outputs_of(embeddings)


def test_bfloat16_autocast():
    module = make_module(12, 6, 3)
    features = torch.randn(4, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = module(features)
    outputs = branch_outputs_of(embeddings)
    assert torch.isfinite(embeddings.float()).all() and torch.isfinite(outputs.errors.float()).all()
    torch.testing.assert_close(embeddings.float(), module.eval()(features), rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(in_features=10, embedding_size=6, num_branches=3), "in_features=10 must be divisible"),
        (dict(in_features=12, embedding_size=8, num_branches=3), "embedding_size=8 must be divisible"),
        (dict(in_features=12, embedding_size=6, num_branches=0), "num_branches must be a positive integer"),
        (dict(in_features=12.0, embedding_size=6, num_branches=3), "in_features must be a positive integer"),
    ],
)
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RelationalEmbedder(**kwargs)


@pytest.mark.parametrize(
    "features, error, match",
    [
        (torch.randn(4, 11), ValueError, r"shape \(batch_size, in_features=12\), got shape \(4, 11\)"),
        (torch.randn(4, 3, 4), ValueError, r"got shape \(4, 3, 4\)"),
        (torch.randn(12), ValueError, r"got shape \(12,\)"),
        (torch.randn(0, 12), ValueError, "batch size 0"),
        (torch.ones(4, 12, dtype=torch.long), TypeError, "floating point"),
        ([[0.0] * 12], TypeError, "must be a torch.Tensor"),
    ],
    ids=["width", "3d", "1d", "empty", "integer", "list"],
)
def test_bad_features(features, error, match):
    with pytest.raises(error, match=match):
        make_module()(features)


def accepts(head_dtype, features_dtype, autocast, training):
    """The documented dtype policy: the head computes in its parameters' dtype, so the
    features must have it; under autocast any pair works except with float64 on one side
    only (autocast does not cast float64). A half-precision head is for inference only."""
    if training and head_dtype in HALF:
        return False
    if head_dtype == features_dtype:
        return True
    return autocast and torch.float64 not in (head_dtype, features_dtype)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("autocast", [False, True], ids=["plain", "autocast"])
@pytest.mark.parametrize("features_dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("head_dtype", ALL_DTYPES, ids=str)
def test_every_dtype_pair_computes_or_gives_our_error(head_dtype, features_dtype, autocast, training):
    g = torch.Generator().manual_seed(2)
    module = make_module(12, 6, 3)
    randomize(module, g)
    features = torch.randn(5, 12, generator=g, dtype=torch.float64)
    # the reference: float64 loops on the parameters and features as rounded to the dtypes used
    module.to(head_dtype).train(training)
    reference = copy.deepcopy(module).double()
    features = features.to(features_dtype)
    expected = naive_forward(reference, features.double())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if not accepts(head_dtype, features_dtype, autocast, training):
            match = "train it with float32" if training and head_dtype in HALF else "features have dtype"
            with pytest.raises(TypeError, match=match):
                module(features)
            return
        embeddings = module(features)
    # compared at the tolerance of the lowest precision involved
    involved = [head_dtype, features_dtype] + ([torch.bfloat16] if autocast else [])
    lowest = max(involved, key=lambda d: torch.finfo(d).eps)
    assert torch.isfinite(embeddings).all()
    assert_close(embeddings, expected[0], lowest)
    if training:
        outputs = branch_outputs_of(embeddings)
        # reconstruction errors in at least float32 (a float16 square overflows from about 256)
        assert outputs.errors.dtype == torch.promote_types(torch.float32, embeddings.dtype)
        assert_close(outputs.nodes, expected[1], lowest)
        assert_close(outputs.errors, expected[2], lowest)


@pytest.mark.parametrize(
    "dtype, scale",
    [(torch.float32, 1e19), (torch.float32, 1e30), (torch.float64, 1e160), (torch.float64, 1e300)],
    ids=["f32-1e19", "f32-1e30", "f64-1e160", "f64-1e300"],
)
def test_huge_finite_features(dtype, scale):
    """The nodes are normalised scale-free (exact for any finite magnitude), so in eval mode
    huge features give the exact embeddings; in training mode the reconstruction error, a
    mean of squares, overflows: our error, never inf."""
    g = torch.Generator().manual_seed(4)
    module = make_module(12, 6, 3, dtype)
    randomize(module, g)
    with torch.no_grad():  # without the biases the head is scale-free in exact arithmetic:
        for layer in [module.nodes, module.a_edges, module.b_edges, module.score]:
            layer.bias.zero_()
    unit = torch.randn(5, 12, generator=g, dtype=torch.float64)
    features = (unit * scale).to(dtype).requires_grad_()
    with pytest.raises(ValueError, match="features are too large for the head .* reconstruction error"):
        module(features)
    module.eval()
    embeddings = module(features)
    # ... so the reference is the float64 loops on the unscaled features
    expected = naive_forward(copy.deepcopy(module).double(), features.detach().double() / scale)[0]
    assert_close(embeddings, expected, dtype)
    (grad,) = torch.autograd.grad(embeddings.sum(), features)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0  # scale-free: d/dh ~ 1/|h|, not 0


def test_largest_features_a_training_forward_computes():
    # float32: mean over 4 dims of (1e18)^2 is 1e36, below float32's 3.4e38: exact
    module = make_module(12, 6, 3)
    features = torch.full((2, 12), 1e18)
    errors = branch_outputs_of(module(features)).errors
    assert torch.isfinite(errors).all()
    assert_close(errors, naive_forward(copy.deepcopy(module).double(), features.double())[2], torch.float32)


def test_edge_score_overflow_is_our_error():
    module = make_module(12, 6, 3).eval()
    with torch.no_grad():
        module.score.weight.fill_(1.0)
        module.a_edges.weight.fill_(1e30)  # w_s . a_i of features 1e10 is ~1e40: beyond float32
    with pytest.raises(ValueError, match="too large for the head .* edge scores"):
        module(torch.full((2, 12), 1e10))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_features(value, training):
    module = make_module().train(training)
    features = torch.randn(4, 12)
    features[1, 5] = value
    with pytest.raises(ValueError, match="features contain NaN or inf"):
        module(features)


def test_features_on_another_device():
    with pytest.raises(ValueError, match="features are on meta but the head's parameters on cpu"):
        make_module()(torch.empty(4, 12, device="meta"))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_zero_rows_and_columns_in_every_dtype(dtype):
    """A zero node pre-activation gives a zero node and a column of zero scores a zero
    message in every dtype (the official 1e-12 floor is 0 in float16: it gave 0/0 = NaN)."""
    module = make_module(8, 4, 2).to(dtype).train(dtype not in HALF)
    with torch.no_grad():
        module.score.weight.zero_()
        module.score.bias.fill_(-1.0)  # every score relu(-1) = 0
        module.nodes.weight[1].zero_()  # branch 1's node pre-activation is its bias, 0
    features = torch.randn(5, 8).to(dtype).requires_grad_()
    embeddings = module(features)
    assert torch.isfinite(embeddings).all()
    assert not embeddings[:, 2:].any()  # [n_2 | u_2] with n_2 = 0 and u_2 = 0
    embeddings.float().sum().backward()
    assert torch.isfinite(features.grad).all()

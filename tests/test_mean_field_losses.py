"""Behaviour shared by MeanFieldContrastiveLoss and MeanFieldClassWiseMultiSimilarityLoss."""

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning import miners, reducers, regularizers
from pytorch_metric_learning.distances import CosineSimilarity

from pml_fieldlosses import losses
from pml_fieldlosses.utils.loss_utils import (
    GatheredNormalizedRows,
    NormalizedRows,
    row_blocks,
    scale_rows_for_normalize,
    unit_rows,
)

from .helpers import (
    DEVICE,
    DTYPES,
    EMBEDDING_SIZE,
    MF_CASES,
    NUM_CLASSES,
    assert_close,
    gradients,
    make_embeddings,
)

MF_LOSSES = [losses.MeanFieldContrastiveLoss, losses.MeanFieldClassWiseMultiSimilarityLoss]
LABELS = torch.tensor([0, 0, 1, 1, 1, 4, 7, 7, 7, 7])


def setup(case, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    build, reference = MF_CASES[case]
    loss_fn = build()
    with torch.no_grad():
        loss_fn.mean_fields.copy_(torch.randn(NUM_CLASSES, EMBEDDING_SIZE, generator=g))
    x = make_embeddings(len(LABELS), dtype, g, device=DEVICE).requires_grad_()
    return loss_fn.to(DEVICE), reference, x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MF_CASES)
def test_regularizer_in_small_blocks_matches_naive(case, dtype):
    loss_fn, reference, x = setup(case, dtype=dtype)
    loss_fn.reg_chunk_entries = 2 * NUM_CLASSES  # two rows per block, five blocks
    labels = LABELS.to(DEVICE)
    loss = loss_fn(x, labels)
    grads = gradients(loss, [x, loss_fn.mean_fields])
    w = loss_fn.mean_fields.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    expected = reference(x64, LABELS.tolist(), w)
    assert_close(loss, expected, dtype)
    for got, want in zip(grads, gradients(expected, [x64, w])):
        assert_close(got, want, dtype)
    with torch.no_grad():  # the path without checkpointing
        assert_close(loss_fn(x, labels), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", MF_CASES)
def test_miner_output_becomes_sample_weights(case, dtype):
    loss_fn, reference, x = setup(case, seed=1, dtype=dtype)
    labels = LABELS.to(DEVICE)
    indices_tuple = miners.MultiSimilarityMiner(epsilon=0.5)(x, labels)
    counts = Counter(i for t in indices_tuple for i in t.tolist())
    weights = [counts[i] / max(counts.values()) for i in range(len(LABELS))]
    assert len(set(weights)) > 1, "the miner should weight the samples unequally"
    loss = loss_fn(x, labels, indices_tuple)
    expected = reference(x.detach().double(), LABELS.tolist(), loss_fn.mean_fields.detach().double(), weights)
    assert_close(loss, expected, dtype)


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_ref_emb_is_refused(loss_class):
    loss_fn = loss_class(NUM_CLASSES, EMBEDDING_SIZE)
    x = torch.randn(4, EMBEDDING_SIZE)
    with pytest.raises(ValueError, match="does not support ref_emb"):
        loss_fn(x, torch.tensor([0, 1, 1, 2]), ref_emb=x.clone(), ref_labels=torch.tensor([0, 1, 1, 2]))


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_parameters_sub_losses_and_recordables(loss_class):
    loss_fn = loss_class(NUM_CLASSES, EMBEDDING_SIZE, mf_reg_weight=0.1)
    assert [name for name, _ in loss_fn.named_parameters()] == ["mean_fields"]
    assert loss_fn.mean_fields.shape == (NUM_CLASSES, EMBEDDING_SIZE)
    assert loss_fn.sub_loss_names() == ["pos_loss", "neg_loss", "mf_reg_loss"]
    for name in ["num_classes", "embedding_size", "mf_reg_weight", "mf_reg_power"]:
        assert name in loss_fn._record_these
    # the default weight_init_func is PML's standard normal, like the official code
    assert abs(loss_fn.mean_fields.std().item() - 1) < 0.3


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_optimising_mean_fields_through_loss_parameters(loss_class):
    torch.manual_seed(0)
    loss_fn = loss_class(NUM_CLASSES, EMBEDDING_SIZE)
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=1.0)
    x = torch.randn(len(LABELS), EMBEDDING_SIZE)
    before = loss_fn(x, LABELS).item()
    for _ in range(20):
        optimizer.zero_grad()
        loss_fn(x, LABELS).backward()
        optimizer.step()
    assert loss_fn(x, LABELS).item() < before


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_sum_reducer_and_sub_loss_parts(loss_class):
    torch.manual_seed(0)
    x = torch.randn(len(LABELS), EMBEDDING_SIZE, dtype=torch.float64)
    mean_loss = loss_class(NUM_CLASSES, EMBEDDING_SIZE, mf_reg_weight=0.2).double()
    sum_loss = loss_class(NUM_CLASSES, EMBEDDING_SIZE, mf_reg_weight=0.2, reducer=reducers.SumReducer())
    sum_loss.load_state_dict(mean_loss.state_dict())
    nothing = loss_class(NUM_CLASSES, EMBEDDING_SIZE, mf_reg_weight=0.2, reducer=reducers.DoNothingReducer())
    nothing.load_state_dict(mean_loss.state_dict())
    parts = nothing(x, LABELS)
    assert set(parts) == {"pos_loss", "neg_loss", "mf_reg_loss"}
    num_elements = len(parts["pos_loss"]["losses"])
    # one element per sample (MFCont) or per class in the batch (MFCWMS), indexed into the batch
    assert num_elements in (len(LABELS), len(LABELS.unique()))
    assert torch.equal(LABELS[parts["pos_loss"]["indices"]].unique(), LABELS.unique())
    reg = parts["mf_reg_loss"]["losses"]
    data_sum = parts["pos_loss"]["losses"].sum() + parts["neg_loss"]["losses"].sum()
    assert_close(sum_loss(x, LABELS), data_sum + reg, torch.float64)
    assert_close(mean_loss(x, LABELS), data_sum / num_elements + reg, torch.float64)


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_class_weighted_reducer_uses_the_element_labels(loss_class):
    torch.manual_seed(0)
    x = torch.randn(len(LABELS), EMBEDDING_SIZE)
    plain = loss_class(NUM_CLASSES, EMBEDDING_SIZE, reducer=reducers.DoNothingReducer())
    parts = plain(x, LABELS)
    results = []
    for weight in [1.0, 2.0]:
        weights = torch.zeros(NUM_CLASSES)
        weights[7] = weight
        weighted = loss_class(NUM_CLASSES, EMBEDDING_SIZE, reducer=reducers.ClassWeightedReducer(weights))
        weighted.load_state_dict(plain.state_dict())
        results.append(weighted(x, LABELS))
    # ClassWeightedReducer: mean over elements of loss * weights[labels[indices]]
    expected = 0
    for name in ["pos_loss", "neg_loss"]:
        element_labels = LABELS[parts[name]["indices"]]
        expected = expected + torch.mean(parts[name]["losses"] * (element_labels == 7))
    assert expected.item() > 0
    assert_close(results[0], expected, torch.float32)
    assert_close(results[1], 2 * expected, torch.float32)


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_weight_and_embedding_regularizers(loss_class):
    torch.manual_seed(0)
    x = torch.randn(len(LABELS), EMBEDDING_SIZE)
    plain = loss_class(NUM_CLASSES, EMBEDDING_SIZE)
    regularized = loss_class(
        NUM_CLASSES,
        EMBEDDING_SIZE,
        weight_regularizer=regularizers.RegularFaceRegularizer(),
        weight_reg_weight=0.5,
        embedding_regularizer=regularizers.LpRegularizer(),
        embedding_reg_weight=0.1,
    )
    regularized.load_state_dict(plain.state_dict())
    assert regularized.sub_loss_names()[-2:] == ["weight_reg_loss", "embedding_reg_loss"]
    expected = (
        plain(x, LABELS)
        + 0.5 * regularizers.RegularFaceRegularizer()(plain.mean_fields)
        + 0.1 * regularizers.LpRegularizer()(x)
    )
    assert_close(regularized(x, LABELS), expected, torch.float32)


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_custom_weight_init_func(loss_class):
    from pytorch_metric_learning.utils import common_functions as c_f

    init = c_f.TorchInitWrapper(torch.nn.init.constant_, val=0.25)
    loss_fn = loss_class(NUM_CLASSES, EMBEDDING_SIZE, weight_init_func=init)
    assert torch.all(loss_fn.mean_fields == 0.25)


@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_float64_inputs_cast_the_mean_fields(loss_class):
    loss_fn = loss_class(NUM_CLASSES, EMBEDDING_SIZE)
    loss = loss_fn(torch.randn(len(LABELS), EMBEDDING_SIZE, dtype=torch.float64), LABELS)
    assert loss.dtype == torch.float64 and loss_fn.mean_fields.dtype == torch.float64


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_half_precision_and_autocast_keep_float32(loss_class, half):
    torch.manual_seed(0)
    loss_fn = loss_class(NUM_CLASSES, EMBEDDING_SIZE, mf_reg_weight=0.1)
    trunk = torch.nn.Linear(8, EMBEDDING_SIZE)
    data = torch.randn(len(LABELS), 8)
    reference = loss_fn(trunk(data), LABELS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(trunk(data), LABELS)
    loss.backward()
    assert loss.dtype == torch.float32 and loss_fn.mean_fields.dtype == torch.float32
    assert torch.isfinite(loss) and torch.isfinite(loss_fn.mean_fields.grad).all()
    assert torch.isfinite(trunk.weight.grad).all()
    torch.testing.assert_close(loss, reference, rtol=3e-2, atol=1e-3)
    # half-precision embeddings outside autocast: computed in float32 too
    x = torch.randn(len(LABELS), EMBEDDING_SIZE).to(half).requires_grad_()
    loss = loss_fn(x, LABELS)
    loss.backward()
    assert loss.dtype == torch.float32 and x.grad.dtype == half and torch.isfinite(x.grad.float()).all()


def test_large_beta_stays_finite():
    # exponents beta * (1 - base) = 500 overflow a plain exp (the official code's) in float32
    torch.manual_seed(0)
    loss_fn = losses.MeanFieldClassWiseMultiSimilarityLoss(
        NUM_CLASSES, EMBEDDING_SIZE, alpha=50.0, beta=1000.0, base=0.5, mf_reg_weight=1.0
    )
    x = torch.randn(len(LABELS), EMBEDDING_SIZE, requires_grad=True)
    loss = loss_fn(x, LABELS)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    assert torch.isfinite(loss_fn.mean_fields.grad).all()


# The mean fields are normalised by NormalizedRows, a fused form of autograd's chain
# normalize(scale_rows_for_normalize(mean_fields)) (the potential losses' proxies and
# embeddings: of normalize(x), scaled=False): it must give that chain's values and gradients
# bit for bit (torch.equal: a zero may differ in sign), on rows of any scale.


def chain_normalize(x):
    return torch.nn.functional.normalize(scale_rows_for_normalize(x), p=2, dim=1)


def plain_normalize(x):
    return torch.nn.functional.normalize(x, p=2, dim=1)


def rows_of_scales(log_scales, dtype, generator):
    """Rows of random entries whose largest |entry| is about 10 ** log_scale (None: a zero row;
    a row of scale s also gets one entry 1e6 times larger, capped below the dtype's largest)."""
    rows = []
    for log_scale in log_scales:
        row = torch.randn(5, generator=generator, dtype=torch.float64)
        if log_scale is None:
            row = torch.zeros(5, dtype=torch.float64)
        else:
            row = row / row.abs().max() * 10.0**log_scale
            row[int(torch.randint(5, (), generator=generator))] *= min(
                1e6, 0.5 * torch.finfo(dtype).max / 10.0**log_scale
            )
        rows.append(row)
    return torch.stack(rows).to(dtype)


def log_scales(dtype):
    tiny, largest = torch.finfo(dtype).smallest_normal, torch.finfo(dtype).max
    return st.lists(
        st.one_of(st.none(), st.floats(math.log10(tiny) - 5, math.log10(largest) - 1)), min_size=1, max_size=6
    )


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_fused_normalization_equals_autograds_chain_bit_for_bit(data, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = rows_of_scales(data.draw(log_scales(dtype)), dtype, g).to(DEVICE).requires_grad_()
    upstream = (
        (
            torch.randn(x.shape, generator=g, dtype=torch.float64)
            * 10.0 ** float(torch.randint(-3, 4, (), generator=g))
        )
        .to(dtype)
        .to(DEVICE)
    )
    for scaled, chain_of in [(True, chain_normalize), (False, plain_normalize)]:
        fused = NormalizedRows.apply(x, 1e-12, scaled)
        (fused_grad,) = torch.autograd.grad(fused, x, upstream)
        chain = chain_of(x)
        (chain_grad,) = torch.autograd.grad(chain, x, upstream)
        assert torch.equal(fused, chain) and torch.equal(fused_grad, chain_grad)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]), seed=st.integers(0, 2**16))
def test_gathered_normalization_equals_autograds_chain_on_the_rows_bit_for_bit(data, dtype, seed):
    """GatheredNormalizedRows (the potential losses' points: the embeddings, then the proxies in
    some pair, taken from the searches' normalised proxies) gives cat([head, normalize(x[rows])])
    and its gradients w.r.t. head and x bit for bit, for any distinct rows (all of them too) of
    rows of any scale (zero rows, rows below eps), in blocks of any size, rows not taken getting
    0."""
    g = torch.Generator().manual_seed(seed)
    x = rows_of_scales(data.draw(log_scales(dtype)), dtype, g).to(DEVICE).requires_grad_()
    num_rows = len(x) if data.draw(st.booleans()) else int(torch.randint(0, len(x) + 1, (), generator=g))
    rows = torch.randperm(len(x), generator=g)[:num_rows].to(DEVICE)
    head = torch.randn(int(torch.randint(0, 5, (), generator=g)), x.shape[1], generator=g, dtype=dtype)
    head = head.to(DEVICE).requires_grad_()
    block_rows = data.draw(st.integers(1, len(x) + 1))
    upstream = torch.randn(len(head) + len(rows), x.shape[1], generator=g, dtype=torch.float64)
    upstream = upstream.to(dtype).to(DEVICE)
    with torch.no_grad():
        normalized = torch.empty_like(x)
        _, norm = unit_rows(x, 1e-12, out=normalized)
        assert torch.equal(normalized, plain_normalize(x))
    gathered = GatheredNormalizedRows.apply(head, x, rows, normalized, norm, 1e-12, block_rows)
    gathered_grads = torch.autograd.grad(gathered, [head, x], upstream)
    chain = torch.cat([head, plain_normalize(torch.nn.functional.embedding(rows, x))])
    chain_grads = torch.autograd.grad(chain, [head, x], upstream)
    assert torch.equal(gathered, chain)
    assert all(torch.equal(a, b) for a, b in zip(gathered_grads, chain_grads))


@pytest.mark.parametrize("num_rows", [0, 1, 2, 3, 7, 8, 9])
@pytest.mark.parametrize("block_rows", [0, 1, 2, 3, 8])
def test_row_blocks_cover_the_rows_in_order_without_single_row_blocks(num_rows, block_rows):
    """The backward blocks of GatheredNormalizedRows: every row once, in order, no block of one
    row unless there is only one row."""
    blocks = row_blocks(num_rows, block_rows)
    assert [i for start, stop in blocks for i in range(start, stop)] == list(range(num_rows))
    assert all(stop - start >= min(2, num_rows) for start, stop in blocks)
    assert all(stop - start <= max(2, block_rows) + 1 for start, stop in blocks)


def test_fused_normalization_second_derivative_is_autograds_chain():
    g = torch.Generator().manual_seed(0)
    ordinary = rows_of_scales([0.0, -1.0, 1.0], torch.float64, g).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x: NormalizedRows.apply(x, 1e-12), (ordinary,))
    assert torch.autograd.gradgradcheck(lambda x: NormalizedRows.apply(x, 1e-12, False), (ordinary,))
    x = rows_of_scales([0.0, None, 200.0, -3.0], torch.float64, g).requires_grad_()
    upstream = torch.randn(x.shape, generator=g, dtype=torch.float64)
    first = [
        torch.autograd.grad(f(x), x, upstream, create_graph=True)[0]
        for f in (lambda x: NormalizedRows.apply(x, 1e-12), chain_normalize)
    ]
    second = [torch.autograd.grad(d.square().sum(), x)[0] for d in first]
    assert torch.equal(*first)
    torch.testing.assert_close(*second, rtol=0, atol=0, equal_nan=True)  # NaN on the zero row, as autograd's


class ThroughTheDistance:
    """The mean-field losses as they computed similarities before the fused normalisation."""

    def mean_field_similarities(self, embeddings):
        return self.distance(embeddings, self.normalizable_mean_fields())

    def normalized_mean_fields(self):
        return self.distance.normalize(self.normalizable_mean_fields())


class RoundedCosine(CosineSimilarity):
    """A distance that normalises in its own way: the losses must call it, not the fused path."""

    def normalize(self, embeddings, dim=1, **kwargs):
        return super().normalize(embeddings, dim=dim, **kwargs).mul(2**10).round().div(2**10)


@pytest.mark.parametrize(
    "distance", [None, CosineSimilarity(power=2), RoundedCosine()], ids=["default", "power2", "own_normalize"]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("loss_class", MF_LOSSES)
def test_losses_equal_the_distance_path_bit_for_bit(loss_class, dtype, distance):
    g = torch.Generator().manual_seed(3)
    kwargs = {"mf_reg_weight": 0.5} if distance is None else {"mf_reg_weight": 0.5, "distance": distance}
    fused = loss_class(NUM_CLASSES, EMBEDDING_SIZE, **kwargs).to(DEVICE, dtype)
    plain = type("Plain", (ThroughTheDistance, loss_class), {})(NUM_CLASSES, EMBEDDING_SIZE, **kwargs)
    plain = plain.to(DEVICE, dtype)
    scales = [0.0, None, 30.0, -20.0, 2.0, 0.0, 35.0, -1.0, 1.0][:NUM_CLASSES]
    mean_fields = rows_of_scales(scales, dtype, g).repeat(1, 2)[:, :EMBEDDING_SIZE].to(DEVICE)
    x = (torch.randn(len(LABELS), EMBEDDING_SIZE, generator=g, dtype=dtype) * 3).to(DEVICE)
    results = []
    for loss_fn in (fused, plain):
        with torch.no_grad():
            loss_fn.mean_fields.copy_(mean_fields)
        x_in = x.clone().requires_grad_()
        loss = loss_fn(x_in, LABELS.to(DEVICE))
        results.append([loss, *gradients(loss, [x_in, loss_fn.mean_fields])])
    for got, want in zip(*results):
        assert torch.equal(got, want)

"""PotentialFieldLoss against the naive loop reference (value and gradients;
its dense and its scalable path), the choice between the paths, edge cases,
gradcheck, bad input, mixed precision."""

import warnings

import pytest
import torch
from pytorch_metric_learning.distances import LpDistance
from pytorch_metric_learning.reducers import MeanReducer

from pml_fieldlosses import losses

from .helpers import (
    DTYPES,
    EMBEDDING_SIZE,
    LABEL_PATTERNS,
    NUM_CLASSES,
    assert_close,
    assert_input_gradient_finite,
    generator_for,
)
from .naive_potential import (
    PATHS,
    PFML_CASES,
    SEARCHES,
    check_against_naive,
    check_cases_match_naive,
    naive_pfml,
    on_path,
    on_search,
    random_inputs,
)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", LABEL_PATTERNS)
@pytest.mark.parametrize("case", PFML_CASES)
def test_matches_naive(case, pattern, dtype, normalized, path):
    check_cases_match_naive(PFML_CASES, case, pattern, dtype, normalized, path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("normalize_proxies", [True, False])
def test_proxies_per_class_and_raw_proxies_match_naive(M, normalize_proxies, dtype, path):
    g = generator_for("M", M, normalize_proxies, dtype)
    build, naive = PFML_CASES["delta0.8_alpha2"]
    labels = [0, 0, 2, 2, 2, 5, 5, 1, 8]
    # raw proxies near the unit sphere, so that they interact with the embeddings
    x, proxies = random_inputs(len(labels), NUM_CLASSES, M, dtype, g, proxy_scale=0.45)
    loss_fn = on_path(build, path, NUM_CLASSES, EMBEDDING_SIZE, M, normalize_proxies=normalize_proxies)
    check_against_naive(loss_fn.to(dtype), naive, x, labels, proxies, dtype, normalize_proxies)


def test_dense_path_is_chosen_for_small_point_sets_only():
    """dense=None: all pairs while (B + N M)^2 D <= dense_entries, else the
    scalable path, which searches all pairs in one product while (B + N M)^2 <=
    all_pairs_entries and follows the neighbour list beyond; the same value every
    way; True and False force a path; anything else is refused."""
    g = generator_for("path choice")
    labels = torch.tensor([0, 0, 2, 5, 5, 1])
    x, proxies = random_inputs(len(labels), NUM_CLASSES, 2, torch.float64, g)
    values = []
    P = len(labels) + 2 * NUM_CLASSES
    for dense, dense_entries, all_pairs_entries in [
        (None, 2**20, 2**21),
        (None, 10, 2**21),
        (None, 10, P * P - 1),
        (True, 10, 0),
        (False, 2**20, 2**21),
        (False, 2**20, 0),
    ]:
        loss_fn = losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE, delta=0.8, alpha=2.0, dense=dense)
        loss_fn.dense_entries, loss_fn.all_pairs_entries = dense_entries, all_pairs_entries
        loss_fn.list_for_few_points = False  # few points: all pairs (its own choice is tested apart)
        with torch.no_grad():
            loss_fn.double().proxies.copy_(proxies)
        values.append(loss_fn(x, labels))
        assert loss_fn.use_dense(P) == (
            dense if dense is not None else P * P * EMBEDDING_SIZE <= dense_entries
        )
        assert loss_fn.searches_all_pairs(P) == (P * P <= all_pairs_entries)
        follows_the_list = not loss_fn.use_dense(P) and not loss_fn.searches_all_pairs(P)
        assert (loss_fn.neighbor_list.stats.num_builds > 0) == follows_the_list
        assert (loss_fn.neighbor_list.state is not None) == follows_the_list
    assert losses.PotentialFieldLoss(3, 4).dense is None
    for value in values[1:]:
        assert_close(value, values[0], torch.float64)
    for bad in ["yes", 1, 0.0]:
        with pytest.raises(ValueError, match="dense must be"):
            losses.PotentialFieldLoss(5, 4, dense=bad)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_duplicated_points_are_finite_and_exact(dtype, path):
    """Coincident points of different classes sit at the distance floor
    (value floor^-alpha, no force); of the same class on the attraction plateau."""
    g = generator_for("duplicates", dtype)
    build, naive = PFML_CASES["delta0.8_alpha2"]
    x, proxies = random_inputs(6, NUM_CLASSES, 2, dtype, g)
    labels = [0, 1, 1, 3, 4, 4]
    x[1] = x[0] * 2.0  # same direction, different class: d = 0 after normalisation
    x[2] = x[0]
    x[4] = x[3]  # different classes
    x[5] = x[3]
    proxies[0, 1] = proxies[0, 0]  # two proxies of class 0 coincide
    proxies[7, 0] = proxies[0, 0] * 0.5  # a proxy of class 7 on one of class 0
    proxies[1, 0] = x[0]  # a proxy of class 1 on an embedding of class 0
    loss_fn = on_path(build, path, NUM_CLASSES, EMBEDDING_SIZE, 2).to(dtype)
    check_against_naive(loss_fn, naive, x, labels, proxies, dtype)
    loss = loss_fn(x.clone().requires_grad_(), torch.tensor(labels))
    assert torch.isfinite(loss)
    assert all(torch.isfinite(t).all() for t in torch.autograd.grad(loss, [loss_fn.proxies]))


def test_default_hyperparameters_and_reducer():
    loss_fn = losses.PotentialFieldLoss(3, 4)
    assert (loss_fn.proxies_per_class, loss_fn.delta, loss_fn.alpha) == (2, 0.2, 4.0)
    assert loss_fn.repulsion_delta == 0.2 and loss_fn.normalize_proxies
    assert loss_fn.proxies.shape == (3, 2, 4)
    assert {name: type(r).__name__ for name, r in loss_fn.reducer.reducers.items()} == {
        "embedding_loss": "SumReducer",
        "proxy_loss": "SumReducer",
    }
    assert [name for name, _ in loss_fn.named_parameters()] == ["proxies"]
    assert set(loss_fn.state_dict()) == {"proxies"}
    for name in ["num_classes", "embedding_size", "proxies_per_class", "delta", "repulsion_delta", "alpha"]:
        assert name in loss_fn._record_these


def test_distance_must_be_euclidean_and_controls_embedding_normalisation():
    from pytorch_metric_learning.distances import CosineSimilarity, LpDistance

    with pytest.raises(AssertionError, match="LpDistance"):
        losses.PotentialFieldLoss(5, 4, distance=CosineSimilarity())
    g = generator_for("distance")
    x = torch.nn.functional.normalize(torch.randn(6, 4, generator=g, dtype=torch.float64), dim=1)
    labels = torch.tensor([0, 0, 1, 2, 3, 3])
    normalizing = losses.PotentialFieldLoss(5, 4, delta=0.8, alpha=2.0).double()
    raw = losses.PotentialFieldLoss(
        5, 4, delta=0.8, alpha=2.0, distance=LpDistance(normalize_embeddings=False)
    ).double()
    raw.load_state_dict(normalizing.state_dict())
    assert_close(raw(x, labels), normalizing(x, labels), torch.float64)  # same on unit vectors
    assert not torch.isclose(raw(3 * x, labels), normalizing(3 * x, labels))  # raw scale matters


def test_sub_losses_with_mean_reducer():
    """embedding_loss has one element per embedding, proxy_loss one per proxy."""
    g = generator_for("mean reducer")
    labels = [0, 0, 2, 5, 5, 1]
    x, proxies = random_inputs(len(labels), NUM_CLASSES, 2, torch.float64, g)
    loss_fn = losses.PotentialFieldLoss(
        NUM_CLASSES, EMBEDDING_SIZE, delta=0.8, alpha=2.0, reducer=MeanReducer()
    ).double()
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    energies = naive_pfml(x, labels, proxies, 0.8, 2.0)
    B = len(labels)
    expected = sum(energies[:B]) / B + sum(energies[B:]) / (len(energies) - B)
    assert_close(loss_fn(x, torch.tensor(labels)), expected, torch.float64)


def test_weight_regularizer_on_proxies():
    from pytorch_metric_learning.regularizers import LpRegularizer

    g = generator_for("weight reg")
    labels = torch.tensor([0, 1, 1])
    x, proxies = random_inputs(3, 4, 2, torch.float64, g)
    plain = losses.PotentialFieldLoss(4, EMBEDDING_SIZE).double()
    regularized = losses.PotentialFieldLoss(
        4, EMBEDDING_SIZE, weight_regularizer=LpRegularizer(), weight_reg_weight=0.5
    ).double()
    with torch.no_grad():
        plain.proxies.copy_(proxies)
        regularized.proxies.copy_(proxies)
    penalty = 0.5 * torch.linalg.vector_norm(proxies, dim=-1).mean()  # LpRegularizer: mean row norm
    assert_close(regularized(x, labels), plain(x, labels) + penalty, torch.float64)


@pytest.mark.parametrize("search", SEARCHES)
def test_chunked_paths_match_naive(search):
    """Tiny blocks: every block loop runs many times, the pair energies run in
    many blocks whose differences are computed again in the backward pass, and
    the search of all pairs or the neighbour list runs in many blocks."""
    g = generator_for("chunks")
    build, naive = PFML_CASES["delta0.6_alpha6_rdelta1.1"]
    labels = [0, 0, 2, 2, 2, 5, 5, 1, 8, 8, 3]
    x, proxies = random_inputs(len(labels), NUM_CLASSES, 3, torch.float64, g)
    loss_fn = build(NUM_CLASSES, EMBEDDING_SIZE, 3, dense=False).double()
    on_search(loss_fn, search)
    loss_fn.chunk_entries = 2 * EMBEDDING_SIZE  # also the neighbour list's blocks
    loss_fn.neighbor_list.pair_cost = 1  # keep the list however dense
    check_against_naive(loss_fn, naive, x, labels, proxies, torch.float64)
    if search == "neighbour-list":
        assert loss_fn.neighbor_list.chunk_entries == 2 * EMBEDDING_SIZE
        assert loss_fn.neighbor_list.state.pairs.shape[1] > 10
    else:
        assert loss_fn.neighbor_list.state is None


def test_gather_blocks_are_chunk_sized_off_the_cpu():
    """On a GPU every block of gathered coordinates is a few kernel launches: the blocks are
    as large as chunk_entries there, gather_entries on a CPU."""
    loss_fn = losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE)
    loss_fn.chunk_entries, loss_fn.gather_entries = 2**22, 2**17
    assert loss_fn.gather_block_entries(torch.device("cpu")) == 2**17
    assert loss_fn.gather_block_entries(torch.device("cuda")) == 2**22
    assert loss_fn.gather_block_entries(torch.device("meta")) == 2**22
    loss_fn.gather_entries = 2**23  # larger than chunk_entries: kept
    assert loss_fn.gather_block_entries(torch.device("cuda")) == 2**23


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("block", [EMBEDDING_SIZE, 2**30])
def test_every_search_and_energy_block_takes_the_devices_block_size(block, search, monkeypatch):
    """The loss passes gather_block_entries to every block loop (the energies, the embedding
    and class searches or the search of all pairs, the neighbour list): tiny blocks and one
    whole block give the same loss and gradients bit for bit, and the list keeps the size it
    was given."""
    g = generator_for("gather blocks")
    labels = [0, 0, 2, 2, 2, 5, 5, 1, 8, 8, 3]
    x, proxies = random_inputs(len(labels), NUM_CLASSES, 3, torch.float64, g)
    results = []
    for patched in [False, True]:
        loss_fn = losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE, 3, delta=0.9, dense=False).double()
        on_search(loss_fn, search)
        loss_fn.neighbor_list.pair_cost = 1  # keep the list however dense
        if patched:
            monkeypatch.setattr(loss_fn, "gather_block_entries", lambda device: block)
        with torch.no_grad():
            loss_fn.proxies.copy_(proxies)
        inputs = x.clone().requires_grad_()
        loss = loss_fn(inputs, torch.tensor(labels))
        loss.backward()
        results.append((loss, inputs.grad, loss_fn.proxies.grad))
        if search == "neighbour-list":
            assert loss_fn.neighbor_list.gather_entries == (block if patched else loss_fn.gather_entries)
    for whole, blocked in zip(*results):
        assert torch.equal(whole, blocked)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", PFML_CASES)
def test_gradcheck_float64(case, path):
    g = generator_for(case, "gradcheck")
    labels = torch.tensor([0, 0, 2, 2, 5, 1])
    x, proxies = random_inputs(len(labels), 6, 2, torch.float64, g)
    x.requires_grad_()
    loss_fn = on_path(PFML_CASES[case][0], path, 6, EMBEDDING_SIZE, 2).double()
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    assert torch.autograd.gradcheck(lambda x, p: loss_fn(x, labels), (x, loss_fn.proxies))


def test_bf16_autocast_keeps_float32_proxies_and_finite_gradients():
    """Under bfloat16 autocast the loss is the float32 loss of the bfloat16 embeddings (not a
    bfloat16 computation; how far that is from the float32 embeddings' loss depends on how
    close the points are: with alpha = 4 a few per cent for some initialisations), with
    float32 proxies and finite gradients."""
    g = generator_for("bf16")
    embedder = torch.nn.Linear(8, EMBEDDING_SIZE)
    loss_fn = losses.PotentialFieldLoss(NUM_CLASSES, EMBEDDING_SIZE, delta=0.8, alpha=4.0)
    data, labels = torch.randn(12, 8, generator=g), torch.randint(0, NUM_CLASSES, (12,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = embedder(data)
        assert embeddings.dtype == torch.bfloat16
        loss = loss_fn(embeddings, labels)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert loss_fn.proxies.dtype == torch.float32 and torch.isfinite(loss_fn.proxies.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in embedder.parameters())
    assert torch.equal(loss.detach(), loss_fn(embeddings.detach().float(), labels).detach())


BAD_CONSTRUCTIONS = [
    (dict(num_classes=0), "num_classes"),
    (dict(num_classes=2.5), "num_classes"),
    (dict(embedding_size=0), "embedding_size"),
    (dict(proxies_per_class=0), "proxies_per_class"),
    (dict(proxies_per_class=1.5), "proxies_per_class"),
    (dict(delta=0), "delta"),
    (dict(delta=-0.1), "delta"),
    (dict(alpha=-1), "alpha"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(repulsion_delta=0), "repulsion_delta"),
    (dict(repulsion_delta=-1), "repulsion_delta"),
    (dict(repulsion_delta=5e-4), "repulsion_delta must be > distance_floor"),
    (dict(alpha=9), "alpha=9 is too large"),
]


@pytest.mark.parametrize("kwargs, message", BAD_CONSTRUCTIONS)
def test_bad_hyperparameters_raise_at_construction(kwargs, message):
    kwargs = {"num_classes": 5, "embedding_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        losses.PotentialFieldLoss(**kwargs)


def test_alpha_zero_warns_and_has_zero_gradient():
    with pytest.warns(UserWarning, match="alpha=0"):
        loss_fn = losses.PotentialFieldLoss(5, 4, alpha=0)
    x = torch.randn(6, 4, requires_grad=True)
    loss = loss_fn(x, torch.tensor([0, 0, 1, 2, 3, 3]))
    grad_x, grad_p = torch.autograd.grad(loss, [x, loss_fn.proxies])
    assert grad_x.abs().max() == 0 and grad_p.abs().max() == 0
    # every ordered pair is -1 (same class) or +1 (different classes)
    class_sizes = [2 + 2, 1 + 2, 1 + 2, 2 + 2, 0 + 2]  # samples + 2 proxies, classes 0..4
    same, P = sum(n * (n - 1) for n in class_sizes), sum(class_sizes)
    assert loss.item() == pytest.approx((P * (P - 1) - same) - same)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses.PotentialFieldLoss(5, 4, alpha=1e-3)


def test_miners_and_reference_sets_are_refused():
    loss_fn = losses.PotentialFieldLoss(5, 4)
    x, y = torch.randn(4, 4), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="indices_tuple is not supported"):
        loss_fn(x, y, indices_tuple=(torch.tensor([0]), torch.tensor([1]), torch.tensor([2])))
    with pytest.raises(ValueError, match="does not support ref_emb"):
        loss_fn(x, y, ref_emb=torch.randn(2, 4), ref_labels=torch.tensor([0, 1]))


NUMERIC_HYPERPARAMETERS = ["delta", "repulsion_delta", "alpha"]
EXTREMES = [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 1e-45, 1e-30, 1e-6, 1e6, 1e30, 1e300]


@pytest.mark.parametrize("value", EXTREMES, ids=str)
@pytest.mark.parametrize("argument", NUMERIC_HYPERPARAMETERS)
def test_every_numeric_hyperparameter_refused_by_name_or_finite(argument, value):
    """The whole class of bad values: NaN, inf, negative, zero and
    overflowing values of every numeric hyperparameter are refused at
    construction by a ValueError naming the argument; what is accepted gives
    a finite loss and gradients in float16 (computed in float32), float32 and
    float64."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # alpha = 0 warns (zero force), see below
            loss_fn = losses.PotentialFieldLoss(5, 4, **{argument: value})
    except ValueError as error:
        assert argument in str(error)
        return
    assert (value >= 0 if argument == "alpha" else value > 0) and value < float("inf")
    labels = torch.tensor([0, 0, 1, 2, 3, 3])
    for dtype in [torch.float16, torch.float32, torch.float64]:
        x = torch.randn(6, 4, generator=generator_for("extremes", argument, value), dtype=torch.float64)
        x = x.to(dtype).requires_grad_()
        loss_fn.zero_grad()
        loss = loss_fn(x, labels)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(loss_fn.proxies.grad).all()
        # float16: the float32 gradient, cast (inf where it leaves float16's range)
        assert_input_gradient_finite(x, lambda full: loss_fn(full, labels))


def test_radii_whose_power_overflows_float32_are_refused():
    with pytest.raises(ValueError, match=r"delta\*\*-alpha"):
        losses.PotentialFieldLoss(5, 4, delta=1e-6, alpha=6.0, repulsion_delta=0.2)  # 1e36
    with pytest.raises(ValueError, match=r"delta\*\*2"):
        losses.PotentialFieldLoss(5, 4, delta=1e16)
    losses.PotentialFieldLoss(5, 4, delta=1e-3, alpha=6.0, repulsion_delta=0.2)  # 1e18: fits with headroom


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("path", ["dense", "scalable"])
def test_normalisation_is_pmls_bit_for_bit(dtype, path):
    """The loss normalises the proxies and embeddings in fewer passes on CPU (NormalizedRows):
    the same loss and gradients, bit for bit, as with PML's distance.normalize; a distance
    with a normalize of its own is called as it is."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(24, EMBEDDING_SIZE, generator=g, dtype=dtype)
    labels = torch.randint(0, NUM_CLASSES, (24,), generator=g)
    results = []
    for distance in (LpDistance(), OwnNormalize()):
        loss_fn = losses.PotentialFieldLoss(
            NUM_CLASSES, EMBEDDING_SIZE, distance=distance, dense=path == "dense"
        )
        loss_fn = loss_fn.to(dtype)
        with torch.no_grad():
            loss_fn.proxies.copy_(
                torch.randn(loss_fn.proxies.shape, generator=torch.Generator().manual_seed(8))
            )
        xg = x.clone().requires_grad_()
        loss = loss_fn(xg, labels)
        results.append([loss, *torch.autograd.grad(loss, [xg, loss_fn.proxies])])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert OwnNormalize.calls > 0


class OwnNormalize(LpDistance):
    """PML's normalisation, as a distance of one's own would define it."""

    calls = 0

    def normalize(self, embeddings, dim=1, **kwargs):
        OwnNormalize.calls += 1
        return torch.nn.functional.normalize(embeddings, p=self.p, dim=dim, **kwargs)

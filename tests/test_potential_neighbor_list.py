"""The proxy neighbour list: its invariants under random motion, the scalable
path of the losses against their dense path (all pairs, ``dense=True``) at
every step of training runs with moving proxies, forced and avoided rebuilds,
the list as a cache (in-place changes, dtype changes, state_dict, no-grad
calls), and the work per step when the proxies cluster as in real training."""

import copy
import dataclasses
import math

import pytest
import torch

from pml_fieldlosses import losses
from pml_fieldlosses.losses.potential import distances, neighbor_list, pair_search
from pml_fieldlosses.losses.potential.neighbor_list import NeighborList
from pml_fieldlosses.losses.potential.pair_search import DenseSearch, bin_threshold

from .helpers import assert_close, pair_set
from .naive_potential import check_dense_reference, dense_reference


def true_close_pairs(points, group_size, cutoff):
    n = len(points)
    groups = torch.arange(n) // group_size
    upper = torch.arange(n).unsqueeze(1) < torch.arange(n).unsqueeze(0)
    close = (torch.cdist(points.double(), points.double()) < cutoff) & (groups[:, None] != groups[None])
    return close & upper


# float32 and float64 points; float32 searched with bfloat16 products too
PRECISIONS = [(torch.float32, False), (torch.float32, True), (torch.float64, False)]
PRECISION_IDS = ["float32", "float32-bfloat16-products", "float64"]


@pytest.mark.parametrize("dtype, bfloat16", PRECISIONS, ids=PRECISION_IDS)
@pytest.mark.parametrize(
    "dim, n, group_size, cutoff, skin, speed",
    [(3, 240, 3, 0.2, 0.1, 0.03), (8, 150, 2, 0.5, 0.3, 0.1), (2, 120, 1, 0.1, 0.05, 0.02)],
)
def test_list_holds_every_close_pair_and_valid_clearances(
    monkeypatch, dim, n, group_size, cutoff, skin, speed, dtype, bfloat16
):
    """Random walks on the sphere (30% of the points move per step): the list
    always contains every pair of different groups closer than the cutoff, and
    every clearance is a lower bound of the reference distance to every point
    of another group that is not listed with it."""
    monkeypatch.setattr(distances.Bfloat16Choice, "min_multiply_adds", 0)  # bfloat16 at any size
    g = torch.Generator().manual_seed(dim)
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=dtype), dim=1)
    # many blocks; the list is always kept
    neighbors = NeighborList(chunk_entries=997, pair_cost=1, bfloat16=bfloat16)
    groups = torch.arange(n) // group_size
    due = 0  # points with pairs listed beyond the radius by a re-anchoring (counted: the path runs)
    for _ in range(40):
        returned = neighbors.update(points, group_size, cutoff, skin)
        due += int(neighbors.state.due.sum())
        # the pairs within the cutoff (after a build) or the list
        for pairs in [returned, neighbors.state.pairs]:
            listed = torch.zeros(n, n, dtype=torch.bool)
            listed[pairs[0], pairs[1]] = True
            assert (pairs[0] < pairs[1]).all() and (groups[pairs[0]] != groups[pairs[1]]).all()
            assert len(set(map(tuple, pairs.T.tolist()))) == pairs.shape[1]  # no duplicates
            assert not (true_close_pairs(points, group_size, cutoff) & ~listed).any()
        reference = neighbors.state.reference.double()
        unlisted = (groups[:, None] != groups[None]) & ~(listed | listed.T)
        nearest = torch.where(unlisted, torch.cdist(reference, reference), torch.inf).amin(dim=1)
        assert (neighbors.state.clearance.double() <= nearest).all()
        step = torch.randn(n, dim, generator=g, dtype=dtype) * speed
        moving = torch.rand(n, 1, generator=g) < 0.3
        points = torch.nn.functional.normalize(points + step * moving, dim=1)
    assert neighbors.stats.num_builds == 1 and neighbors.stats.num_partial_rebuilds > 5 and due > 0


def test_the_kept_terms_of_the_reference_positions_equal_fresh_ones(monkeypatch):
    """The norms and Bfloat16Factors of the reference positions kept between updates (computed
    again only for the re-anchored points) equal, bit for bit, those computed from scratch at
    every search: the factors gathered for each search against those of the reference
    positions in its order, the norms against all positions' norms after every update;
    through builds, re-anchorings, bfloat16 products turned off and on again, and a reset."""
    monkeypatch.setattr(distances.Bfloat16Choice, "min_multiply_adds", 0)  # bfloat16 at any size
    gathered, checked = distances.Bfloat16Factors.gathered, []

    def checked_gathered(factors, kept, order, num_rows):
        factors = gathered(factors, kept, order, num_rows)
        expected = distances.Bfloat16Factors().update(neighbors.state.reference[order], num_rows, 2**10)
        assert torch.equal(factors.rows, expected.rows) and torch.equal(factors.columns, expected.columns)
        assert (factors.radius, factors.error) == (expected.radius, expected.error)
        checked.append(num_rows)
        return factors

    monkeypatch.setattr(distances.Bfloat16Factors, "gathered", checked_gathered)
    g = torch.Generator().manual_seed(4)
    n, dim = 200, 8
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    neighbors = NeighborList(chunk_entries=997, pair_cost=1, bfloat16=True)
    for step in range(40):
        neighbors.bfloat16 = not 10 <= step < 15
        if step == 25:
            neighbors.reset()
        neighbors.update(points, 2, 0.3, 0.2)
        reference = neighbors.state.reference
        assert torch.equal(neighbors._reference_norms, torch.linalg.vector_norm(reference, dim=1))
        moving = torch.rand(n, 1, generator=g) < 0.3
        points = torch.nn.functional.normalize(
            points + 0.05 * torch.randn(n, dim, generator=g) * moving, dim=1
        )
    assert neighbors.stats.num_builds == 2 and neighbors.stats.num_partial_rebuilds > 20
    assert len(checked) > 20 and min(checked) < n


@pytest.mark.parametrize("gather_entries", [3 * 8, 2**18])
def test_the_motion_measured_in_blocks_equals_the_plain_expressions(monkeypatch, gather_entries):
    """The displacements since the previous update (odometers, speed) and since the reference
    positions (what _follow is given), measured in blocks of rows, equal vector_norm of the
    plain differences bit for bit, and the previous positions become the current ones."""
    follow, given = NeighborList._follow, []
    monkeypatch.setattr(NeighborList, "_follow", lambda nl, p, d: given.append(d) or follow(nl, p, d))
    g = torch.Generator().manual_seed(6)
    points = torch.nn.functional.normalize(torch.randn(50, 8, generator=g), dim=1)
    neighbors = NeighborList(pair_cost=1)
    neighbors.gather_entries = gather_entries  # blocks of 3 rows, or one
    neighbors.update(points, 2, 0.3, 0.2)
    odometer = torch.zeros(50, dtype=torch.float64)
    for _ in range(5):
        previous, reference = points, neighbors.state.reference.clone()
        points = torch.nn.functional.normalize(points + 0.02 * torch.randn(50, 8, generator=g), dim=1)
        neighbors.update(points, 2, 0.3, 0.2)
        step = torch.linalg.vector_norm(points - previous, dim=1)
        odometer += step.double() * (1 + neighbor_list.tolerance(points))
        assert torch.equal(neighbors.motion.odometer, odometer) and torch.equal(
            neighbors.motion.previous, points
        )
        assert neighbors.motion.speed == step.kthvalue(45).values.item()
        assert torch.equal(given[-1], torch.linalg.vector_norm(points - reference, dim=1))
    assert len(given) == 5


def training_run(loss_fn, steps, proxy_lr, generator, check=True):
    """Adam on an embedding table and on the proxies; the loss and all
    gradients are compared with the loss's dense path at every step (float64)."""
    C, _, D = loss_fn.proxies.shape
    table = torch.nn.Parameter(torch.randn(5 * C, D, generator=generator, dtype=torch.float64))
    table_labels = torch.arange(C).repeat(5)
    optimizer = torch.optim.Adam(
        [{"params": [table]}, {"params": loss_fn.parameters(), "lr": proxy_lr}], lr=0.02
    )
    mismatches = 0
    for _ in range(steps):
        batch = torch.randperm(len(table), generator=generator)[:16]
        x, labels = table[batch].detach().requires_grad_(), table_labels[batch]
        loss = loss_fn(x, labels)
        grads = torch.autograd.grad(loss, [x, loss_fn.proxies])
        if check:
            check_dense_reference(loss_fn, x, labels, loss, grads)
        else:
            expected = dense_reference(loss_fn, x, labels)[0]
            mismatches += int(not torch.isclose(loss.detach(), expected.detach(), rtol=1e-9, atol=0))
        optimizer.zero_grad()
        table.grad = torch.zeros_like(table).index_add_(0, batch, grads[0])
        loss_fn.proxies.grad = grads[1]
        optimizer.step()
    return mismatches


LOSS_KWARGS = {
    "PFML": {"delta": 0.3, "alpha": 4.0, "repulsion_delta": 0.5},
    "CPML": {"delta": 0.3, "repulsion_delta": 0.5},
}


def scalable_loss(name, C, M, D, **kwargs):
    """The loss with its scalable path and its neighbour list forced (these point sets are
    small enough for the automatic choices to take the dense path or the search of all
    pairs)."""
    loss_class = losses.PotentialFieldLoss if name == "PFML" else losses.ContrastivePotentialLoss
    loss_fn = loss_class(C, D, proxies_per_class=M, dense=False, **{**LOSS_KWARGS[name], **kwargs}).double()
    loss_fn.all_pairs_entries = 0
    with torch.no_grad():  # the same proxies whatever the global random state (test order)
        generator = torch.Generator().manual_seed(C * M * D)
        loss_fn.proxies.copy_(torch.randn(C, M, D, generator=generator, dtype=torch.float64))
    return loss_fn


def make_loss(name, C=40, M=3, D=4):
    loss_fn = scalable_loss(name, C, M, D)
    loss_fn.neighbor_list.pair_cost = 1  # keep the list however dense (the list's own tests)
    return loss_fn


@pytest.mark.parametrize("skin", [0.05, 1.0], ids=["skin0.05", "skin1"])
@pytest.mark.parametrize("name", LOSS_KWARGS)
def test_matches_dense_reference_at_every_training_step(name, skin):
    """40 classes x 3 proxies in 4 dimensions with a large proxy learning rate:
    proxies of different classes cross each other's repulsion radius all the
    time, and the list is partly searched again at most steps."""
    g = torch.Generator().manual_seed(len(name) + int(skin * 100))
    loss_fn = make_loss(name)
    loss_fn.neighbor_skin = skin
    training_run(loss_fn, 25, 0.1, g)
    neighbors = loss_fn.neighbor_list
    # (several updates re-anchor, each with one search as a rule: the mechanism under test runs)
    assert neighbors.stats.num_partial_rebuilds >= 3 and neighbors.state.pairs.shape[1] > 0


@pytest.mark.parametrize("dtype, bfloat16", PRECISIONS, ids=PRECISION_IDS)
def test_dense_search_returns_the_close_pairs_and_agrees_with_the_list(monkeypatch, dtype, bfloat16):
    """The other PairSearch: every update returns exactly the pairs of different groups
    within the cutoff (up to the rounding margin), after one search of all pairs; along a
    random walk, the neighbour list returns the same pairs (its products in bfloat16 too)."""
    monkeypatch.setattr(distances.Bfloat16Choice, "min_multiply_adds", 0)  # bfloat16 at any size
    g = torch.Generator().manual_seed(13)
    n, dim, group_size, cutoff, skin = 150, 3, 3, 0.25, 0.1
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=dtype), dim=1)
    dense = DenseSearch(chunk_entries=997)
    neighbors = NeighborList(chunk_entries=997, pair_cost=1, bfloat16=bfloat16)
    for step in range(20):
        returned = dense.update(points, group_size, cutoff, skin)
        listed = torch.zeros(n, n, dtype=torch.bool)
        listed[returned[0], returned[1]] = True
        assert (returned[0] < returned[1]).all() and listed.sum() == returned.shape[1]
        assert not (true_close_pairs(points, group_size, cutoff) & ~listed).any()
        assert (listed & ~true_close_pairs(points, group_size, cutoff * (1 + 1e-5))).sum() == 0
        assert dense.stats.last_searched >= n * (n - 1) / 2 and dense.stats.num_dense_steps == step + 1
        assert dense.stats.last_evaluated >= dense.stats.last_returned == returned.shape[1]
        from_list = neighbors.update(points, group_size, cutoff, skin)
        assert pair_set(from_list) == pair_set(returned)
        moving = torch.rand(n, 1, generator=g) < 0.3
        walk = 0.02 * torch.randn(n, dim, generator=g, dtype=dtype)
        points = torch.nn.functional.normalize(points + walk * moving, dim=1)
    assert neighbors.stats.num_partial_rebuilds > 0


@pytest.mark.parametrize("few_points", [False, True], ids=["its-search", "all-pairs"])
@pytest.mark.parametrize("name", LOSS_KWARGS)
def test_a_loss_with_a_dense_search_matches_its_dense_path(name, few_points):
    """The loss's proxy pair search is any PairSearch: with a DenseSearch in place of the
    neighbour list, every training step equals the dense reference; for few points (with
    list_for_few_points None, whose choice weighs a NeighborList's work) all pairs are searched
    in one product at every step."""
    g = torch.Generator().manual_seed(len(name))
    loss_fn = scalable_loss(name, 40, 3, 4)
    loss_fn.neighbor_list = DenseSearch()
    loss_fn.collect_stats = True
    if few_points:
        loss_fn.all_pairs_entries = 2**62
    training_run(loss_fn, 8, 0.1, g)
    assert loss_fn.neighbor_list.stats.num_dense_steps == (0 if few_points else 8)
    assert loss_fn.num_searched_proxy_pairs >= 120 * 119 / 2 and loss_fn.num_reanchored_proxies == 0


def test_a_stale_list_is_caught_by_the_dense_comparison(monkeypatch):
    """The comparison above can fail: with re-anchoring disabled, the list
    goes stale and the values disagree with the dense reference."""
    monkeypatch.setattr(NeighborList, "_reanchor", lambda self, points, moved, needed: None)
    g = torch.Generator().manual_seed(7)
    loss_fn = make_loss("PFML")
    loss_fn.neighbor_skin = 0.05
    mismatches = training_run(loss_fn, 25, 0.1, g, check=False)
    assert mismatches > 0


def two_proxies(gap):
    """Two classes, one raw proxy each (normalize_proxies=False) on the x axis,
    ``gap`` apart and far from the unit sphere; repulsion_delta 0.3, skin 0.3:
    the pair is listed iff gap < 0.6."""
    loss_fn = losses.PotentialFieldLoss(
        2,
        2,
        proxies_per_class=1,
        delta=0.2,
        alpha=4.0,
        repulsion_delta=0.3,
        normalize_proxies=False,
        dense=False,
    ).double()
    loss_fn.all_pairs_entries = 0  # the neighbour list, not the search of all pairs
    loss_fn.neighbor_list.pair_cost = 1  # keep the list of this one pair
    loss_fn.neighbor_list.max_reanchored = 1.0  # re-anchor both rather than build
    with torch.no_grad():
        loss_fn.proxies.copy_(torch.tensor([[[5.0, 0.0]], [[5.0 + gap, 0.0]]], dtype=torch.float64))
    return loss_fn


def check_dense(loss_fn, x, labels):
    loss = loss_fn(x, labels)
    assert_close(loss, dense_reference(loss_fn, x, labels)[0], torch.float64)
    return loss


def move(loss_fn, shift):
    """An in-place change between calls, like an optimiser step: the proxies
    approach each other by ``shift`` each."""
    with torch.no_grad():
        loss_fn.proxies[0, 0, 0] += shift
        loss_fn.proxies[1, 0, 0] -= shift


def test_rebuild_happens_exactly_when_the_displacements_require_it():
    x, labels = torch.tensor([[0.0, 1.0]], dtype=torch.float64), torch.tensor([0])
    loss_fn = two_proxies(0.61)  # just outside the list radius 0.6: clearance 0.61
    neighbors = loss_fn.neighbor_list
    check_dense(loss_fn, x, labels)
    assert neighbors.stats.num_builds == 1 and neighbors.state.pairs.shape[1] == 0
    # each moves 0.15 <= (0.61 - 0.3) / 2 = 0.155: no search, the pair is still >= 0.3 apart
    move(loss_fn, 0.15)
    check_dense(loss_fn, x, labels)
    assert neighbors.stats.last_reanchored == 0 and neighbors.stats.num_partial_rebuilds == 0
    # another 0.01 each: both exceed their allowance; the pair is now 0.29 < 0.3 apart
    # and must repel, which only a search can find
    move(loss_fn, 0.01)
    loss = check_dense(loss_fn, x, labels)
    assert neighbors.stats.last_reanchored == 2 and neighbors.stats.num_partial_rebuilds == 1
    assert neighbors.state.pairs.tolist() == [[0], [1]]
    assert loss > check_dense(two_proxies(0.61), x, labels)  # the repulsion is in
    # no movement: nothing to do
    check_dense(loss_fn, x, labels)
    assert neighbors.stats.last_reanchored == 0 and neighbors.stats.num_partial_rebuilds == 1


def test_one_moving_proxy_is_searched_alone():
    g = torch.Generator().manual_seed(3)
    loss_fn = make_loss("PFML", C=30, M=2, D=3)
    x, labels = torch.randn(8, 3, generator=g, dtype=torch.float64), torch.randint(0, 30, (8,), generator=g)
    loss_fn(x, labels)
    neighbors = loss_fn.neighbor_list
    for _ in range(3):
        with torch.no_grad():
            # a big jump (to the antipode: 2 apart once normalised, beyond any allowance)
            loss_fn.proxies[4, 1] = -loss_fn.proxies[4, 1]
        loss = loss_fn(x, labels)
        assert neighbors.stats.last_reanchored == 1
        assert_close(loss, dense_reference(loss_fn, x, labels)[0], torch.float64)
    assert neighbors.stats.num_builds == 1 and neighbors.stats.num_partial_rebuilds == 3


def test_list_is_a_cache_across_dtype_changes_state_dict_and_no_grad_calls():
    g = torch.Generator().manual_seed(5)
    loss_fn = make_loss("PFML", C=30, M=2, D=3).float()
    x, labels = torch.randn(8, 3, generator=g), torch.randint(0, 30, (8,), generator=g)
    neighbors = loss_fn.neighbor_list
    with torch.inference_mode():
        loss_fn(x, labels)
    with torch.no_grad():
        loss_fn.proxies[3, 0] = -loss_fn.proxies[3, 0]
    # the list made under inference mode is updated and used in a grad-mode call
    x32 = x.clone().requires_grad_()
    loss = loss_fn(x32, labels)
    loss.backward()
    assert neighbors.stats.num_builds == 1 and neighbors.stats.last_reanchored >= 1
    expected = dense_reference(copy.deepcopy(loss_fn).double(), x.double(), labels)[0]
    assert_close(loss, expected, torch.float32)
    with torch.no_grad():
        loss_fn(x, labels)
    assert neighbors.stats.num_builds == 1 and neighbors.state.reference.dtype == torch.float32
    # a float64 call casts the proxies (PML's cast_types) and rebuilds the list
    x64 = x.double().requires_grad_()
    loss = loss_fn(x64, labels)
    assert neighbors.stats.num_builds == 2 and neighbors.state.reference.dtype == torch.float64
    loss.backward()  # the list made under inference mode does not get in the way
    assert set(loss_fn.state_dict()) == {"proxies"}

    # load other proxies in place: the displacements notice (every proxy moved: a build)
    other = make_loss("PFML", C=30, M=2, D=3)
    with torch.no_grad():
        other.proxies.copy_(torch.randn(30, 2, 3, generator=g, dtype=torch.float64))
    loss_fn.load_state_dict(other.state_dict())
    expected = dense_reference(other, x64, labels)[0]
    assert_close(loss_fn(x64, labels), expected, torch.float64)
    assert neighbors.stats.num_builds == 3 and neighbors.stats.last_reanchored == 60
    assert_close(copy.deepcopy(loss_fn)(x64, labels), expected, torch.float64)
    loss_fn(x64, labels)
    assert neighbors.stats.num_builds == 3 and neighbors.stats.last_reanchored == 0
    # a changed repulsion radius or skin invalidates the list
    loss_fn.neighbor_skin = 0.5
    loss_fn(x64, labels)
    assert neighbors.stats.num_builds == 4


@pytest.mark.parametrize("name", LOSS_KWARGS)
def test_a_step_makes_no_fresh_tensor_the_size_of_all_proxies(name):
    """The searches keep their n x D tensors (the points they see, the displacements, the
    previous positions, a search's reordered references) between steps and write them in
    place: a fresh tensor that size at every step is new memory above the size the C allocator
    reuses at tens of thousands of proxies, whose page faults cost more than the search. Here
    the proxies move, some are re-anchored and listed pairs evaluated, but only a few proxies
    are near an embedding, so nothing else needs all of them (and with D > n, the searches'
    products of rows against all n points are smaller than n x D)."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(11)
    C, M, D, B = 200, 1, 256, 8
    loss_fn = scalable_loss(name, C, M, D)
    optimizer = torch.optim.SGD(loss_fn.parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        x = torch.randn(B, D, generator=g, requires_grad=True)
        loss_fn(x, torch.randint(0, C, (B,), generator=g)).backward()
        optimizer.step()
    # a fifth of the proxies move far at each step: they are re-anchored
    moves = [
        torch.randn(loss_fn.proxies.shape, generator=g) * (torch.rand(C, 1, 1, generator=g) < 0.2)
        for _ in range(4)
    ]
    batches = [(torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g)) for _ in moves]
    stats = loss_fn.neighbor_list.stats
    builds, reanchored = stats.num_builds, stats.num_reanchored
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for (x, labels), move in zip(batches, moves):
            loss_fn(x, labels)
            loss_fn.proxies.add_(move)
    assert stats.num_builds == builds and stats.num_reanchored > reanchored  # the searches ran
    size = C * M * D * loss_fn.proxies.element_size()
    fresh = [
        (event.name, event.cpu_memory_usage) for event in prof.events() if event.cpu_memory_usage >= size
    ]
    assert fresh == []


@pytest.mark.parametrize("name", LOSS_KWARGS)
def test_results_do_not_depend_on_the_lists_history(name):
    """A loss whose list was maintained through 15 Adam steps and a fresh one
    loaded with the same proxies (as after resuming from a checkpoint) give
    bit-identical values and gradients: the candidate pairs are processed in a
    canonical order and the list's extra candidates add exact zeros."""
    g = torch.Generator().manual_seed(11)
    trained = make_loss(name).float()
    optimizer = torch.optim.Adam(trained.parameters(), lr=0.1)
    x, labels = torch.randn(16, 4, generator=g), torch.randint(0, 40, (16,), generator=g)
    for _ in range(15):
        optimizer.zero_grad()
        trained(x, labels).backward()
        optimizer.step()
    fresh = make_loss(name).float()
    fresh.load_state_dict(trained.state_dict())
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss1, loss2 = trained(x1, labels), fresh(x2, labels)
    assert trained.neighbor_list.stats.num_partial_rebuilds > 0 and fresh.neighbor_list.stats.num_builds == 1
    assert not torch.equal(trained.neighbor_list.state.pairs, fresh.neighbor_list.state.pairs)
    assert torch.equal(loss1, loss2)
    grads1 = torch.autograd.grad(loss1, [x1, trained.proxies])
    grads2 = torch.autograd.grad(loss2, [x2, fresh.proxies])
    assert all(torch.equal(a, b) for a, b in zip(grads1, grads2))


def proxy_pair_work(loss_fn):
    """Work of the last call on the proxy pairs, in matrix-product entries:
    the entries searched plus pair_cost per pair whose distance was computed
    from its coordinates (the loss's recordable statistics)."""
    dim = loss_fn.proxies.shape[-1]
    pair_cost = NeighborList.default_pair_cost(dim)
    return loss_fn.num_searched_proxy_pairs + pair_cost * loss_fn.num_evaluated_proxy_pairs


def contracting_run(loss_fn, steps, generator):
    """Adam on the proxies with the loss plus a pull of the raw proxies towards
    one point, and the embeddings near that point (features that cluster):
    the proxies contract until most pairs are within the list radius
    (cutoff + skin), as in real training. Checks loss and gradients
    against the loss's dense path at every step; returns for each step the work,
    the entries searched, the pairs evaluated and the pairs within the cutoff
    (which any exact method evaluates), and the fraction of proxy pairs within the radius after the last step."""
    C, M, D = loss_fn.proxies.shape
    loss_fn.collect_stats = True
    centre = torch.nn.functional.normalize(torch.randn(D, generator=generator, dtype=torch.float64), dim=0)
    x = centre + 0.1 * torch.randn(12, D, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, C, (12,), generator=generator)
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=0.3)
    work = []
    for _ in range(steps):
        xg = x.clone().requires_grad_()
        loss = loss_fn(xg, labels)
        flat = torch.nn.functional.normalize(loss_fn.proxies.detach().reshape(C * M, D), dim=1)
        interacting = true_close_pairs(flat, M, loss_fn.repulsion_delta * (1 + 1e-6)).sum().item()
        work.append(
            (
                proxy_pair_work(loss_fn),
                loss_fn.num_searched_proxy_pairs,
                loss_fn.num_evaluated_proxy_pairs,
                interacting,
            )
        )
        check_dense_reference(loss_fn, x, labels, loss, torch.autograd.grad(loss, [xg, loss_fn.proxies]))
        optimizer.zero_grad()
        (loss_fn(x, labels) + 100 * (loss_fn.proxies - 3 * centre).pow(2).sum()).backward()
        optimizer.step()
    flat = torch.nn.functional.normalize(loss_fn.proxies.detach().reshape(C * M, D), dim=1)
    radius = loss_fn.repulsion_delta * (1 + loss_fn.neighbor_skin)
    return work, (torch.pdist(flat) < radius).double().mean().item()


@pytest.mark.parametrize("name", LOSS_KWARGS)
def test_contracted_proxies_cost_at_most_about_the_dense_computation(name):
    """Proxies driven into a cluster where over 90% of their pairs
    are within the list radius. Counted, not timed: each step searches at most
    3x the dense computation's n^2 entries (the (N M)^2 block of docs/derivations.md,
    'The cost of an update') and evaluates from coordinates at most the pairs a sparse list may
    hold or the pairs within the cutoff (which interact); for PFML, whose
    repulsion keeps the pairs out of the cutoff, the weighted work stays within
    3 n^2. Values and gradients equal the dense reference at every step."""
    g = torch.Generator().manual_seed(1)
    C, M, D = 50, 2, 8
    loss_fn = scalable_loss(name, C, M, D)
    steps, within_radius = contracting_run(loss_fn, 15, g)
    dense = (C * M) ** 2
    max_pairs = loss_fn.neighbor_list.max_pairs(loss_fn.proxies.reshape(C * M, D))
    assert within_radius > 0.9
    for work, searched, evaluated, interacting in steps:
        assert searched <= 3 * dense
        assert evaluated <= max(max_pairs, interacting)
        if name == "PFML":
            assert work <= 3 * dense, [step[0] / dense for step in steps]
    assert loss_fn.neighbor_list.stats.num_dense_builds >= 1


def test_a_kept_dense_list_exceeds_the_work_bound(monkeypatch):
    """The bounds above can fail: a list kept however dense, with a fixed skin,
    whose every listed pair is evaluated from its coordinates (the list
    without its separation filter)."""

    def every_listed_pair(self, points, displacements):
        self.stats.last_evaluated = self.state.pairs.shape[1]
        return self.state.pairs

    monkeypatch.setattr(NeighborList, "_may_be_close", every_listed_pair)
    g = torch.Generator().manual_seed(1)
    loss_fn = make_loss("PFML", C=50, M=2, D=8)  # pair_cost 1: the list is always kept
    loss_fn.neighbor_list.adaptive_skin = False  # with the largest skin's radius
    steps, within_radius = contracting_run(loss_fn, 15, g)
    max_pairs = NeighborList().max_pairs(loss_fn.proxies.reshape(100, 8))
    assert within_radius > 0.85
    assert max(work for work, *_ in steps) > 3 * 100**2
    assert any(evaluated > max(max_pairs, interacting) for _, _, evaluated, interacting in steps)


def test_switches_between_list_and_dense_builds_stay_exact():
    """Proxies spread out (a sparse list is kept and followed), then clustered
    within the cutoff (the list is dropped: dense steps), then spread again
    (the list is kept again): equal to the dense reference at every step,
    including the steps right after each switch."""
    g = torch.Generator().manual_seed(23)
    C, M, D = 40, 2, 16
    loss_fn = scalable_loss("PFML", C, M, D)
    neighbors = loss_fn.neighbor_list
    x = torch.randn(10, D, generator=g, dtype=torch.float64)
    labels = torch.randint(0, C, (10,), generator=g)
    spread_out = torch.randn(C, M, D, generator=g, dtype=torch.float64)
    centre = torch.randn(D, generator=g, dtype=torch.float64)
    clustered = centre + 0.12 * torch.randn(C, M, D, generator=g, dtype=torch.float64)
    kept = []
    for phase in [spread_out, clustered, spread_out]:
        for step in range(4):
            with torch.no_grad():
                loss_fn.proxies.copy_(
                    phase + 0.003 * step * torch.randn(C, M, D, generator=g, dtype=torch.float64)
                )
            xg = x.clone().requires_grad_()
            loss = loss_fn(xg, labels)
            check_dense_reference(loss_fn, x, labels, loss, torch.autograd.grad(loss, [xg, loss_fn.proxies]))
            kept.append(neighbors.state.kept)
    # the jump into the cluster re-anchors every proxy: a build, which drops the list (its
    # pairs within the cutoff alone exceed max_pairs); dense steps follow. The jump back is
    # a dense step whose measured speed (the jump) is too fast for any list; the next step
    # measures the slow motion again and builds.
    assert kept == [True] * 4 + [False] * 5 + [True] * 3
    stats = neighbors.stats
    assert stats.num_dense_builds == 1 and stats.num_dense_steps == 5 and stats.num_builds == 3


def test_bfloat16_products_give_the_float32_searches_results_bit_for_bit(monkeypatch):
    """The searches' products in bfloat16 (bounds a few thousandths apart in squared distance;
    the embeddings' pairs between them evaluated again in float32, the list's pairs listed by
    their lower bounds) change the work, never the result: along a float32 trajectory through
    a kept list with re-anchoring, dense steps and back, both losses give the same values and
    gradients bit for bit at every step, equal to the dense path."""
    monkeypatch.setattr(distances.Bfloat16Choice, "min_multiply_adds", 0)  # bfloat16 at any size
    used, observed, searched = [], [], []
    use, observe = distances.Bfloat16Choice.use, distances.Bfloat16Choice.observe
    monkeypatch.setattr(
        distances.Bfloat16Choice, "use", lambda self, *a: use(self, *a) and (used.append(self) or True)
    )
    pays = neighbor_list.NeighborList.bfloat16_pays

    def recording_pays(search, points, num_rows, *args):
        bfloat16 = pays(search, points, num_rows, *args)
        searched.append((num_rows, len(points), bfloat16))
        return bfloat16

    monkeypatch.setattr(neighbor_list.NeighborList, "bfloat16_pays", recording_pays)
    monkeypatch.setattr(
        distances.Bfloat16Choice,
        "observe",
        lambda self, *counts: observed.append((self, *counts)) or observe(self, *counts),
    )
    g = torch.Generator().manual_seed(29)
    C, M, D = 40, 2, 16
    fast, plain = (scalable_loss("PFML", C, M, D).float() for _ in range(2))
    fast.bfloat16_search, plain.bfloat16_search = True, False
    x = torch.randn(24, D, generator=g)
    labels = torch.randint(0, C, (24,), generator=g)
    spread_out = torch.randn(C, M, D, generator=g)
    clustered = torch.randn(D, generator=g) + 0.12 * torch.randn(C, M, D, generator=g)
    for phase in [spread_out, clustered, spread_out]:
        drift = torch.zeros(C, M, D)
        for _ in range(8):  # a fifth of the proxies drift at each step
            moving = torch.rand(C, M, 1, generator=g) < 0.2
            drift += 0.15 * torch.randn(C, M, D, generator=g) * moving
            results = []
            for loss_fn in (fast, plain):
                with torch.no_grad():
                    loss_fn.proxies.copy_(phase + drift)
                xg = x.clone().requires_grad_()
                loss = loss_fn(xg, labels)
                results.append([loss, *torch.autograd.grad(loss, [xg, loss_fn.proxies])])
            assert all(torch.equal(a, b) for a, b in zip(*results))
            check_dense_reference(fast, x, labels, results[0][0], results[0][1:], torch.float32)
    assert fast.neighbor_list.bfloat16 and not plain.neighbor_list.bfloat16
    # bfloat16 products for the embeddings at every step, the re-anchorings and the dense steps
    assert used.count(fast._bfloat16_choice) == 24 and any(undecided for _, undecided, _ in observed)
    # a re-anchoring: bfloat16 products of fewer rows than points
    assert any(rows < points and bfloat16 for rows, points, bfloat16 in searched)
    # (a dense step takes the loss's factors of the proxies, and observes what they left)
    assert any(choice is fast.neighbor_list.dense_choice for choice, *_ in observed)
    stats = fast.neighbor_list.stats
    assert stats.num_partial_rebuilds > 0 and stats.num_dense_steps > 0 and stats.num_builds >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_search_of_all_pairs_gives_the_lists_results_bit_for_bit(dtype, monkeypatch):
    """Few points (all_pairs_entries) are searched in one product of all points with all
    points, instead of the embeddings' search, the classes' and the neighbour list: another
    superset of the pairs off their plateau, whose extra pairs add exact zeros. Along a
    trajectory through spread-out and clustered proxies, with float32 and (float32 points)
    bfloat16 products, the losses and gradients equal the list's bit for bit at every step,
    and the dense path's; switching between the searches on one loss (the list forgotten,
    built again when it is next followed) changes nothing either."""
    monkeypatch.setattr(distances.Bfloat16Choice, "min_multiply_adds", 0)  # bfloat16 at any size
    factor_rows = []  # (rows, points) of each bfloat16 factors' update
    update = distances.Bfloat16Factors.update
    monkeypatch.setattr(
        distances.Bfloat16Factors,
        "update",
        lambda self, points, num_rows, *args: (
            factor_rows.append((num_rows, len(points))) or update(self, points, num_rows, *args)
        ),
    )
    g = torch.Generator().manual_seed(31)
    C, M, D = 40, 2, 16
    listed, whole, whole_bfloat16 = (scalable_loss("PFML", C, M, D).to(dtype) for _ in range(3))
    for loss_fn in (listed, whole, whole_bfloat16):
        loss_fn.bfloat16_search = loss_fn is whole_bfloat16
        loss_fn.collect_stats = True
        loss_fn.list_for_few_points = False  # all_pairs_entries alone decides
    whole.all_pairs_entries = whole_bfloat16.all_pairs_entries = 2**62
    x = torch.randn(24, D, generator=g, dtype=dtype)
    labels = torch.randint(0, C, (24,), generator=g)
    spread_out = torch.randn(C, M, D, generator=g, dtype=dtype)
    clustered = torch.randn(D, generator=g, dtype=dtype) + 0.12 * torch.randn(
        C, M, D, generator=g, dtype=dtype
    )
    n = C * M
    for phase, switch in [(spread_out, False), (clustered, False), (spread_out, True)]:
        if switch:  # the list's loss searches all pairs now, the other follows a list
            listed.all_pairs_entries, whole.all_pairs_entries = 2**62, 0
        drift = torch.zeros(C, M, D, dtype=dtype)
        for _ in range(6):  # a fifth of the proxies drift at each step
            moving = torch.rand(C, M, 1, generator=g) < 0.2
            drift += 0.15 * torch.randn(C, M, D, generator=g, dtype=dtype) * moving
            results = []
            for loss_fn in (listed, whole, whole_bfloat16):
                with torch.no_grad():
                    loss_fn.proxies.copy_(phase + drift)
                xg = x.clone().requires_grad_()
                loss = loss_fn(xg, labels)
                results.append([loss, *torch.autograd.grad(loss, [xg, loss_fn.proxies])])
                searched_all = loss_fn.searches_all_pairs(len(x) + n)
                assert (loss_fn.neighbor_list.state is None) == searched_all
                if searched_all:
                    assert loss_fn.num_searched_proxy_pairs == n * (n - 1) // 2
                    assert loss_fn.num_reanchored_proxies == 0
            for other in results[1:]:
                assert all(torch.equal(a, b) for a, b in zip(results[0], other))
            check_dense_reference(whole_bfloat16, x, labels, results[2][0], results[2][1:], dtype)
    assert whole.neighbor_list.stats.num_builds >= 1  # it followed a list after the switch
    # bfloat16 products of every point against every point (float32 points only)
    assert ((len(x) + n, len(x) + n) in factor_rows) == (dtype == torch.float32)


def test_the_choice_of_bfloat16_products_leaves_the_random_state_and_follows_the_setting():
    """Measuring whether bfloat16 products pay (once per process) leaves torch's global random
    state as it was (fixed-seed runs stay the same); bfloat16_search None follows that
    measurement, True and False force it, for float32 points only."""
    distances.bfloat16_products_pay.cache_clear()
    before = torch.get_rng_state()
    pays = distances.bfloat16_products_pay()
    assert torch.equal(torch.get_rng_state(), before) and isinstance(pays, bool)
    loss_fn = scalable_loss("PFML", 10, 2, 8)
    points32, points64 = torch.randn(5, 8), torch.randn(5, 8, dtype=torch.float64)
    for setting, expected in [(None, pays), (True, True), (False, False)]:
        loss_fn.bfloat16_search = setting
        assert loss_fn.use_bfloat16_search(points32) == expected
        assert not loss_fn.use_bfloat16_search(points64)


def test_bfloat16_choice_keeps_products_only_while_they_pay():
    """Bfloat16Choice: bfloat16 for products of at least min_multiply_adds while the share of
    entries left undecided times pair_cost stays below one half; after a float32 choice,
    bfloat16 again at the retry-th call, waiting twice as long after each try that did not
    pay (up to max_retry)."""
    choice = distances.Bfloat16Choice()
    large = choice.min_multiply_adds
    assert not choice.use(72, large - 1) and choice.use(72, large)
    choice.observe(undecided=10, entries=72_000)  # 0.01 of pair_cost: pays
    assert choice.use(72, large)
    choice.observe(undecided=1_000, entries=72_000)  # one pair_cost in 72 entries: does not
    calls = [choice.use(72, large) for _ in range(2 * choice.retry)]
    assert calls == ([False] * (choice.retry - 1) + [True]) * 2
    # each try that does not pay doubles the wait, up to max_retry; one that pays resets it
    waits = []
    for _ in range(6):
        calls = 1
        while not choice.use(72, large):
            calls += 1
        waits.append(calls)
        choice.observe(undecided=1_000, entries=72_000)
    assert waits == [min(choice.retry * 2**k, choice.max_retry) for k in range(6)]
    assert choice.wait == choice.max_retry
    choice.observe(undecided=10, entries=72_000)
    assert choice.wait == choice.retry and choice.use(72, large)


@pytest.mark.parametrize("bfloat16", [False, True])
def test_list_choice_follows_the_list_while_its_work_stays_low(bfloat16):
    """ListChoice: the list at first; its first update (the build) left out, it is given up
    once its work over the last ``window`` updates averages above max_work (a quarter of it
    with bfloat16 products); then all pairs for ``retry`` updates, twice as many after each
    time the list was given up within 2 window updates of being taken up (up to max_retry),
    and ``retry`` again after a list that lasted longer."""
    choice = pair_search.ListChoice()
    W = choice.window
    limit = choice.max_work / 4 if bfloat16 else choice.max_work
    assert choice.use_list()
    choice.observe(50.0, bfloat16)  # the build: left out
    for _ in range(3 * W):  # just at the limit: kept
        assert choice.use_list()
        choice.observe(limit, bfloat16)
    choice.observe(limit + W * 1e-3, bfloat16)  # the window's mean just above it
    assert not choice.use_list() and choice.wait == choice.retry  # it had lasted 3 W updates
    waits = []
    for _ in range(8):
        updates = 0
        while not choice.use_list():
            choice.observe()
            updates += 1
        waits.append(updates)
        for _ in range(W + 1):  # the build, then a window above the limit: given up soon
            choice.observe(2 * limit, bfloat16)
    assert waits == [min(choice.retry * 2**k, choice.max_retry) for k in range(8)]
    assert waits[-1] == choice.max_retry
    # given up after 2 window updates (its build included): soon, the wait doubles; after one
    # more: the wait is back to retry
    for lasted, wait in [(2 * W, 2 * choice.retry), (2 * W + 1, choice.retry)]:
        choice.wait = choice.retry
        while not choice.use_list():
            choice.observe()
        for _ in range(lasted - 1):
            choice.observe(0.0, bfloat16)
        assert choice.use_list()
        choice.observe(W * limit + 1.0, bfloat16)  # the window's mean above the limit
        assert not choice.use_list() and choice.wait == wait, lasted
    # a window below max_work / 4 keeps the list with either kind of product
    while not choice.use_list():
        choice.observe()
    for _ in range(4 * W):
        choice.observe(choice.max_work / 5, bfloat16)
        assert choice.use_list()


@pytest.mark.parametrize("name", ["PFML", "CPML"])
def test_few_points_follow_the_list_while_it_is_cheap_and_search_all_pairs_otherwise(name):
    """With few points (all_pairs_entries) and list_for_few_points None, on a CPU, the loss
    follows the neighbour list while the proxies barely move, and searches all pairs once the
    list costs more (proxies that jump at every step rebuild it at every update), taking the
    list up again later; at every step the loss and gradients equal those of the search of all
    pairs and of the list, each forced, bit for bit, and the dense path's."""
    g = torch.Generator().manual_seed(44)
    C, M, D = 40, 2, 16
    auto, listed, whole = (scalable_loss(name, C, M, D) for _ in range(3))
    auto.all_pairs_entries = whole.all_pairs_entries = 2**62
    auto.list_for_few_points, listed.list_for_few_points, whole.list_for_few_points = None, True, False
    x = torch.randn(24, D, generator=g, dtype=torch.float64)
    labels = torch.randint(0, C, (24,), generator=g)
    proxies = torch.randn(C, M, D, generator=g, dtype=torch.float64)
    followed = []
    for step in range(60):
        if 10 <= step < 40:  # the proxies jump: the list rebuilds at every update
            proxies = torch.randn(C, M, D, generator=g, dtype=torch.float64)
        else:  # they barely move
            proxies = proxies + 1e-6 * torch.randn(C, M, D, generator=g, dtype=torch.float64)
        results = []
        for loss_fn in (auto, listed, whole):
            with torch.no_grad():
                loss_fn.proxies.copy_(proxies)
            xg = x.clone().requires_grad_()
            loss = loss_fn(xg, labels)
            results.append([loss, *torch.autograd.grad(loss, [xg, loss_fn.proxies])])
        for other in results[1:]:
            assert all(torch.equal(a, b) for a, b in zip(results[0], other))
        followed.append(auto.neighbor_list.state is not None)
    check_dense_reference(auto, x, labels, results[0][0], results[0][1:], torch.float64)
    assert all(followed[:10])  # still proxies: the list
    # given up within a window of the jumps' first update, until they end (given up within 2
    # windows of being taken up at step 0, the list waits 2 retry updates before its next try)
    assert not any(followed[10 + pair_search.ListChoice.window : 40])
    assert all(followed[-10:])  # taken up again, and kept while the proxies barely move


@pytest.mark.parametrize("products", ["float32", "bfloat16"])
def test_a_dense_sweep_counts_within_a_bin_as_its_whole_counts_do(products):
    """dense_sweep's within_bin: the same pairs and work as the whole counts, and the number of
    pairs the counts put in the bins up to that one, exactly, for every bin."""
    g = torch.Generator().manual_seed(5)
    points = torch.nn.functional.normalize(torch.randn(300, 8, generator=g), dim=1)
    radii = 0.6 + 0.5 * torch.arange(17, dtype=torch.float64) / 16
    factors = distances.Bfloat16Factors().update(points, 300, 2**12) if products == "bfloat16" else None
    full = pair_search.dense_sweep(points, 3, 0.6, radii, 2**12, factors)
    cumulative = torch.cumsum(full.counts, 0)
    assert 0 < cumulative[0] < cumulative[-1]
    for bin in range(16):
        sweep = pair_search.dense_sweep(points, 3, 0.6, radii, 2**12, factors, within_bin=bin)
        assert torch.equal(sweep.pairs, full.pairs) and sweep.searched == full.searched
        assert sweep.counts is None and sweep.within == cumulative[bin].item()
        # counted until it passes a limit: exact up to it, beyond it once passed
        limit = cumulative[bin].item()
        assert pair_search.dense_sweep(points, 3, 0.6, radii, 2**12, factors, bin, limit).within == limit
        if limit > 0:
            short = pair_search.dense_sweep(points, 3, 0.6, radii, 2**12, factors, bin, limit - 1)
            assert short.within > limit - 1 and torch.equal(short.pairs, full.pairs)
    assert full.within is None


@pytest.mark.parametrize("group_size", [1, 2, 3, 5])
@pytest.mark.parametrize("chunk_entries", [2**10, 2**13, 2**20])
def test_a_dense_sweep_finds_exactly_the_pairs_of_different_groups_within_the_cutoff(
    group_size, chunk_entries
):
    """dense_sweep's blocks start anywhere within a group (rows per block not a multiple of the
    group size): every pair (i < j) of different groups within the cutoff, once, and no other
    (float64, far from the cutoff's rounding margin)."""
    g = torch.Generator().manual_seed(group_size)
    points = torch.nn.functional.normalize(torch.randn(203, 3, generator=g, dtype=torch.float64), dim=1)
    sweep = pair_search.dense_sweep(
        points, group_size, 0.5, torch.tensor([0.5], dtype=torch.float64), chunk_entries
    )
    found = sweep.pairs.T.tolist()
    assert len(found) == len(set(map(tuple, found)))
    expected = true_close_pairs(points, group_size, 0.5).nonzero().tolist()
    assert sorted(found) == sorted(expected) and len(expected) > 100


@pytest.mark.parametrize("dim", [8, 512])
def test_a_dense_sweep_with_bfloat16_products_finds_and_counts_at_least_every_pair(dim):
    """dense_sweep with Bfloat16Factors: its pairs contain every pair of different groups
    within the cutoff by exact distances, and its counts are upper bounds: up to every radius,
    at least as many as the pairs of different groups within it."""
    g = torch.Generator().manual_seed(dim)
    n, group_size, cutoff = 300, 3, 0.6 if dim == 8 else 1.35
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    radii = cutoff + 0.3 * torch.arange(17, dtype=torch.float64) / 16
    factors = distances.Bfloat16Factors().update(points, n, 2**12)
    sweep = pair_search.dense_sweep(points, group_size, cutoff, radii, 2**12, factors=factors)
    found = torch.zeros(n, n, dtype=torch.bool)
    found[sweep.pairs[0], sweep.pairs[1]] = True
    assert true_close_pairs(points, group_size, cutoff).any()
    assert not (true_close_pairs(points, group_size, cutoff) & ~found).any()
    groups = torch.arange(n) // group_size
    exact = torch.cdist(points.double(), points.double()).triu(diagonal=1)
    exact[groups.unsqueeze(1) == groups.unsqueeze(0)] = 0
    within = [((exact > 0) & (exact < r)).sum().item() for r in radii[1:].tolist()]
    assert (torch.cumsum(sweep.counts, 0) >= torch.tensor(within, dtype=torch.float64)).all()
    assert sweep.counts.sum() > 0


def test_bin_threshold_is_the_edge_of_the_binnings_own_arithmetic():
    """bin_threshold: torch's float32 binning puts the threshold beyond the bin and the float32
    value just below it in a bin up to it, for edges of any scale and every bin."""
    for low, high, bins in [(0.16, 0.64, 64), (0.1600001, 0.6400003, 64), (1e-4, 3e-4, 7), (2.5, 9.0, 16)]:
        for bin in range(bins):
            threshold = torch.tensor([bin_threshold(low, high, bins, bin)], dtype=torch.float32)
            before = torch.nextafter(threshold, torch.tensor([-math.inf]))
            assert pair_search.bin_positions(threshold.clone(), low, high, bins) >= bin + 1
            assert pair_search.bin_positions(before, low, high, bins) < bin + 1


def test_bin_counts_bins_as_histc_does():
    """bin_counts: the counts of torch.histc on values clamped to the first bin, up to values on
    a bin's edge (rounding), with NaN and values from the top edge on in no bin."""
    g = torch.Generator().manual_seed(2)
    values = torch.rand(300, 70, generator=g) * 1.2
    values[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.16])
    expected = torch.histc(values.clamp(min=0.16), 64, 0.16, 0.64).double()
    counts = pair_search.bin_counts(values.clone(), 0.16, 0.64, 64)
    assert counts.dtype == torch.float64 and counts.shape == (64,)
    assert (counts - expected).abs().sum() <= 4 and abs(counts.sum() - expected.sum()) <= 2
    finite = values[values.isfinite() | (values == -float("inf"))].double()
    assert abs(counts.sum().item() - (finite < 0.64).sum().item()) <= 2  # NaN and inf in no bin
    # the count up to a bin by one comparison of the positions (dense_sweep's within_bin): the same
    for bin, up_to in enumerate(torch.cumsum(counts, 0).tolist()):
        assert (pair_search.bin_positions(values.clone(), 0.16, 0.64, 64) < bin + 1).sum() == up_to


class WholeCountsList(NeighborList):
    """The dense steps' rule as stated, from the whole counts at every dense step: build from
    the largest skin whose pairs fit in max_pairs, once that skin and the skin chosen for the
    speed both reach smallest_skin."""

    def _dense_step(self, points, factors=None):
        state = self.state
        radii = state.cutoff + state.max_skin * torch.arange(65, dtype=torch.float64) / 64
        sweep = pair_search.dense_sweep(points, state.group_size, state.cutoff, radii, self.chunk_entries)
        self.stats.num_dense_steps += 1
        fits = torch.cumsum(sweep.counts, 0) <= self.max_pairs(points)
        largest = radii[1:][fits].max().item() - state.cutoff if fits.any() else 0.0
        chosen, smallest = self.choose_skin(state.max_skin), self.smallest_skin()
        if largest > 0 and min(largest, chosen) >= smallest:
            return self._build(points, state.group_size, state.cutoff, state.max_skin, largest)
        return self.within_cutoff(points, sweep.pairs, state.cutoff)


def expanding_run(dtype, neighbors):
    """Points of 60 groups of 2 that start clustered (no list fits: dense steps) and spread
    out step by step until a list fits and is kept; per update, whether a list is kept, the
    search's statistics (but the entries searched) and the pairs returned."""
    g = torch.Generator().manual_seed(31)
    centre = torch.randn(16, dtype=dtype, generator=g)
    noise = torch.randn(120, 16, dtype=dtype, generator=g)
    trace = []
    for scale in torch.linspace(0.05, 1.5, 40).tolist():
        points = torch.nn.functional.normalize(centre + scale * noise, dim=1)
        pairs = neighbors.update(points, 2, 0.4, 0.4)
        stats = dataclasses.replace(neighbors.stats, last_searched=0)
        trace.append((neighbors.state.kept, stats, pairs.tolist()))
    return trace


def recorded_sweeps(monkeypatch):
    """The list's dense sweeps from now on, as what each counted: "within" (the pairs up to one
    bin), "counts" (the pairs by distance) or "none"."""
    whole_sweep, sweeps = pair_search.dense_sweep, []

    def recording_sweep(*args, **kwargs):
        sweep = whole_sweep(*args, **kwargs)
        sweeps.append(
            "within" if sweep.within is not None else "counts" if sweep.counts is not None else "none"
        )
        return sweep

    monkeypatch.setattr(neighbor_list, "dense_sweep", recording_sweep)
    return sweeps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_steps_decide_as_the_whole_counts(monkeypatch, dtype):
    """A dense step counts only the pairs within the first radius whose skin reaches
    smallest_skin, and the pairs by distance only when they fit (then it builds): the same
    builds, lists, dense steps and pairs as the rule applied to the whole counts at every dense
    step, from clustered points to points spread enough for a list."""
    sweeps = recorded_sweeps(monkeypatch)
    trace = expanding_run(dtype, NeighborList())
    assert trace == expanding_run(dtype, WholeCountsList())
    kept = [k for k, *_ in trace]
    assert not kept[1] and kept[-1], kept
    builds_from_dense = sum(1 for (k, *_), (k2, *_) in zip(trace, trace[1:]) if k2 and not k)
    assert sweeps.count("within") > builds_from_dense >= 1
    assert sweeps.count("counts") == builds_from_dense


def test_a_dense_step_that_cannot_keep_a_list_counts_nothing(monkeypatch):
    """Points that move so fast that no skin is worth keeping (the skin their speed calls for is
    below smallest_skin): each dense step sweeps at the cutoff alone, with no pair counts by
    distance (they could not make it build), and returns every close pair."""
    sweeps = recorded_sweeps(monkeypatch)
    g = torch.Generator().manual_seed(8)
    neighbors = NeighborList(pair_cost=1000)  # room for 19 pairs of 200 points: the list is given up
    points = torch.randn(200, 3, generator=g, dtype=torch.float64)
    for _ in range(8):
        points = points + 0.2 * torch.randn(points.shape, generator=g, dtype=points.dtype)
        found = neighbors.update(points, 2, 0.5, 0.3)
        expected = true_close_pairs(points, 2, 0.5)
        assert pair_set(found) == pair_set(expected.nonzero().T)
    assert not neighbors.state.kept and neighbors.choose_skin(0.3) < neighbors.smallest_skin()
    assert neighbors.stats.num_dense_steps >= 5 and sweeps.count("none") == neighbors.stats.num_dense_steps
    assert "counts" not in sweeps


def shell(n, dim, median, generator):
    """n unit vectors around one direction, at pairwise distances concentrated
    around ``median`` (a cap of the sphere in ``dim`` dimensions)."""
    sigma = (median**2 / (2 * (dim - 1) - (dim - 1) * median**2)) ** 0.5
    noise = sigma * torch.randn(n, dim, generator=generator, dtype=torch.float64)
    noise[:, 0] = 1.0
    return torch.nn.functional.normalize(noise, dim=1)


def contracted_run(loss_fn, speed, steps, generator, check=True):
    """The measured case of a real run: trained proxies at a median pairwise distance
    of ~0.6, none within the repulsion radius 0.4 but all within the largest
    radius 0.8, each moving ``speed`` per step in a random direction. Returns
    the entries searched and the pairs evaluated at each step (compared with
    the dense path at every step if ``check``)."""
    C, M, D = loss_fn.proxies.shape
    loss_fn.collect_stats = True
    n = C * M
    points = shell(n, D, 0.6, generator)
    distances = torch.pdist(points)
    assert 0.55 < distances.median() < 0.65 and distances.min() > 0.4
    assert (distances < 0.4 * (1 + loss_fn.neighbor_skin)).all()  # all within the largest radius
    x = shell(12, D, 0.6, generator)
    labels = torch.randint(0, C, (12,), generator=generator)
    searched, evaluated = [], []
    for _ in range(steps):
        with torch.no_grad():
            loss_fn.proxies.copy_(points.view(C, M, D))
        xg = x.clone().requires_grad_()
        loss = loss_fn(xg, labels)
        if check:
            check_dense_reference(loss_fn, x, labels, loss, torch.autograd.grad(loss, [xg, loss_fn.proxies]))
        searched.append(loss_fn.num_searched_proxy_pairs)
        evaluated.append(loss_fn.num_evaluated_proxy_pairs)
        step = torch.randn(n, D, generator=generator, dtype=torch.float64)
        points = torch.nn.functional.normalize(points + speed * step / step.norm(dim=1, keepdim=True), dim=1)
    return searched, evaluated


def no_shrinking(monkeypatch, fitting_skin=False):
    """The behaviour before the shrinking radius: a build whose list would
    exceed max_pairs gives the list up; unless ``fitting_skin``, a build after
    a dense step also starts from the skin chosen for the speed, not from the
    largest skin whose pairs were counted to fit."""
    monkeypatch.setattr(
        NeighborList, "_shrink", lambda self, found, found_sq, nearest, keep, slack: (False, [], [], 0.0)
    )
    if not fitting_skin:
        build = NeighborList._build
        monkeypatch.setattr(
            NeighborList,
            "_build",
            lambda self, points, group_size, cutoff, skin, fitting=None: build(
                self, points, group_size, cutoff, skin
            ),
        )


@pytest.mark.parametrize(
    "adaptive, shrink, fitting, speed",
    [
        (True, False, False, 0.002),
        (False, True, True, 0.002),
        (False, False, True, 0.002),
        (True, True, True, 0.01),
    ],
    ids=["adaptive-skin-alone", "shrinking-radius-alone", "fitting-skin-alone", "all-fast-motion"],
)
@pytest.mark.parametrize("name", LOSS_KWARGS)
def test_contracted_proxies_without_close_pairs_keep_a_sparse_list(
    monkeypatch, name, adaptive, shrink, fitting, speed
):
    """The largest skin's radius covers every pair, so a list of that radius
    is too dense to keep. Each mechanism alone keeps a sparse list: the
    adaptive skin (from the observed displacements, 0.002 per step: radius
    ~0.43; the first build, before any motion was seen, gives the list up and
    the next step builds again), the build shrinking the radius until the
    list fits max_pairs (a fixed skin; or motion too fast for the adaptive
    skin to stay sparse, 0.01 per step: radius 0.56), or a fixed skin's first
    list given up and the dense step's pair counts choosing the largest skin
    that fits for the next build. After the first steps, a step searches far
    fewer entries than the dense computation's n^2 and evaluates at most a
    sparse list's pairs. Exact against the dense path at every step."""
    if not shrink:
        no_shrinking(monkeypatch, fitting_skin=fitting)
    g = torch.Generator().manual_seed(5)
    loss_fn = scalable_loss(name, 60, 2, 128, delta=0.3, repulsion_delta=0.4)
    loss_fn.neighbor_list.adaptive_skin = adaptive
    searched, evaluated = contracted_run(loss_fn, speed, 12, g)
    neighbors, n = loss_fn.neighbor_list, 120
    max_pairs = neighbors.max_pairs(torch.empty(n, 128))
    assert all(s <= 3 * n**2 for s in searched) and all(e <= max_pairs for e in evaluated)
    assert neighbors.state.kept and neighbors.state.skin < loss_fn.neighbor_skin * 0.4
    assert (neighbors.stats.num_builds, neighbors.stats.num_dense_steps) == ((1, 0) if shrink else (2, 1))
    assert sum(searched[3:]) < n**2, searched  # the last 9 steps together: less than one dense search


@pytest.mark.parametrize("adaptive, speed", [(False, 0.002), (True, 0.01)], ids=["fixed-skin", "fast-motion"])
def test_without_shrinking_the_radius_every_step_searches_all_pairs(monkeypatch, adaptive, speed):
    """The checks above can fail: with the radius never shrunk (a list over
    max_pairs given up, and a build after a dense step starting from the skin
    chosen for the speed: the behaviour before), neither a fixed skin nor the
    adaptive skin under fast motion keeps a sparse list, and every step
    searches all pairs."""
    no_shrinking(monkeypatch)
    g = torch.Generator().manual_seed(5)
    loss_fn = scalable_loss("PFML", 60, 2, 128, delta=0.3, repulsion_delta=0.4)
    loss_fn.neighbor_list.adaptive_skin = adaptive
    searched, _ = contracted_run(loss_fn, speed, 6, g, check=False)
    assert not loss_fn.neighbor_list.state.kept
    assert all(s >= 120**2 / 2 for s in searched[3:]), searched


def test_a_proxy_moving_alone_uses_its_whole_allowance():
    """One proxy approaches a still one: while the other stays put, the mover
    may use the whole allowance clearance - cutoff (0.31), not half of it, and
    is re-anchored alone once the pair may be within the cutoff."""
    x, labels = torch.tensor([[0.0, 1.0]], dtype=torch.float64), torch.tensor([0])
    loss_fn = two_proxies(0.61)
    neighbors = loss_fn.neighbor_list
    check_dense(loss_fn, x, labels)
    with torch.no_grad():
        loss_fn.proxies[1, 0, 0] -= 0.3  # 0.3 <= 0.31, beyond half of it
    check_dense(loss_fn, x, labels)
    assert neighbors.stats.last_reanchored == 0 and neighbors.stats.num_partial_rebuilds == 0
    with torch.no_grad():
        loss_fn.proxies[1, 0, 0] -= 0.02  # now 0.29 apart: within the cutoff 0.3
    loss = check_dense(loss_fn, x, labels)
    assert neighbors.stats.last_reanchored == 1 and neighbors.state.pairs.tolist() == [[0], [1]]
    assert loss > check_dense(two_proxies(0.61), x, labels)  # the repulsion is in


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_list_stays_exact_when_one_point_moves_far_and_the_others_little(dtype):
    """Heterogeneous motion (the case the second re-anchoring test is for):
    each step one random point moves by up to the skin and the others by a
    little; the returned pairs always contain every pair within the cutoff."""
    g = torch.Generator().manual_seed(17)
    n, dim, group_size, cutoff, skin = 200, 3, 2, 0.15, 0.1
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g, dtype=dtype), dim=1)
    neighbors = NeighborList(chunk_entries=997, pair_cost=1, adaptive_skin=False)
    for _ in range(60):
        returned = neighbors.update(points, group_size, cutoff, skin)
        listed = torch.zeros(n, n, dtype=torch.bool)
        listed[returned[0], returned[1]] = True
        assert not (true_close_pairs(points, group_size, cutoff) & ~listed).any()
        step = 0.002 * torch.randn(n, dim, generator=g, dtype=dtype)
        jumper = torch.randint(0, n, (1,), generator=g)
        step[jumper] = (
            skin
            * torch.rand(1, generator=g, dtype=dtype)
            * torch.nn.functional.normalize(torch.randn(1, dim, generator=g, dtype=dtype), dim=1)
        )
        points = torch.nn.functional.normalize(points + step, dim=1)
    assert neighbors.stats.num_builds == 1 and neighbors.stats.num_partial_rebuilds > 5


@pytest.mark.parametrize("renew", [True, False], ids=["odometer-bound", "no-bound"])
def test_a_listed_pair_that_keeps_its_distance_is_evaluated_every_few_updates(renew):
    """Two points 0.45 apart (cutoff 0.4, in the list) translate together by
    0.004 per update: their reference certificate (0.45 - both displacements)
    fails after 6 updates, and neither is ever re-anchored (no unlisted
    point). With the odometer bound, an evaluation shows the pair still 0.45
    apart and certifies it for the next 0.05 / 0.008 = 6 updates; without it
    (the bound never renewed), the pair is evaluated at every later update.
    The pair is never returned (it never comes within the cutoff)."""
    neighbors = NeighborList(pair_cost=1, adaptive_skin=False)
    points = torch.tensor([[0.0, 0.0, 0.0], [0.45, 0.0, 0.0]], dtype=torch.float64)
    step = torch.tensor([0.0, 0.004, 0.0], dtype=torch.float64)
    evaluated = []
    for _ in range(31):
        if not renew and neighbors.state is not None:
            neighbors.state.bound = torch.full_like(neighbors.state.bound, float("-inf"))
        assert neighbors.update(points, 1, 0.4, 0.3).shape[1] == 0
        evaluated.append(neighbors.stats.last_evaluated)
        points = points + step
    assert neighbors.stats.num_builds == 1 and neighbors.stats.num_partial_rebuilds == 0
    assert evaluated[1:7] == [0] * 6  # the reference certificate holds
    if renew:
        assert 3 <= sum(evaluated[7:]) <= 6, evaluated
    else:
        assert evaluated[7:] == [1] * 24


def test_an_update_that_raises_leaves_no_half_made_state():
    """A search that raises in the middle of an update (an out-of-memory
    error, say, caught by a trainer that goes on) must not leave new
    references beside the old list and clearances: the state is reset, the
    next update builds, and every later update holds every close pair."""
    g = torch.Generator().manual_seed(3)
    n, dim, cutoff, skin = 150, 3, 0.3, 0.15
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    neighbors = NeighborList(pair_cost=1)
    search, failed = neighbors._search, []

    def search_failing_once(rows, others, build, needed=None):
        if not build and not failed:  # the first partial rebuild
            failed.append(len(rows))
            raise RuntimeError("out of memory")
        return search(rows, others, build, needed)

    neighbors._search = search_failing_once
    for _ in range(40):
        try:
            returned = neighbors.update(points, 1, cutoff, skin)
        except RuntimeError:
            assert neighbors.state is None and neighbors.motion is None
            returned = neighbors.update(points, 1, cutoff, skin)
        listed = torch.zeros(n, n, dtype=torch.bool)
        listed[returned[0], returned[1]] = True
        assert not (true_close_pairs(points, 1, cutoff) & ~listed).any()
        points = torch.nn.functional.normalize(points + 0.04 * torch.randn(n, dim, generator=g), dim=1)
    assert failed and neighbors.stats.num_builds == 2


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_searches_multiply_in_full_precision_whatever_the_global_setting(monkeypatch, precision):
    """The searches' rounding margins hold for float32 products, not TF32 or
    bfloat16 ones: under set_float32_matmul_precision("high" / "medium") the
    list's and the loss's searches run at "highest", and the setting is
    restored afterwards."""
    seen = []
    row_blocks, candidate_pairs = distances.row_blocks, losses.PotentialFieldLoss.candidate_pairs

    def recording_row_blocks(*args):
        for block in row_blocks(*args):
            seen.append(torch.get_float32_matmul_precision())
            yield block

    def recording_candidate_pairs(self, *args):
        seen.append(torch.get_float32_matmul_precision())
        return candidate_pairs(self, *args)

    for searches in (neighbor_list, pair_search):  # the list's and the dense searches' products
        monkeypatch.setattr(searches, "row_blocks", recording_row_blocks)
    monkeypatch.setattr(losses.PotentialFieldLoss, "candidate_pairs", recording_candidate_pairs)
    loss_fn = scalable_loss("PFML", 50, 2, 16)
    x, labels = torch.randn(32, 16), torch.arange(32) % 50
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        loss_fn(x, labels).backward()
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(previous)
    assert seen and set(seen) == {"highest"}


@pytest.mark.parametrize("group_size", [1, 2, 3])
def test_mask_own_groups_sets_exactly_each_rows_group_members(group_size):
    """A search block (rows at start + r against the points from start, in a search's order):
    exactly the entries of each row with a member of its group are set to inf, members placed
    before the block included in none, whatever the order and the block."""
    g = torch.Generator().manual_seed(group_size)
    n = 7 * group_size
    for _ in range(20):
        order = torch.randperm(n, generator=g)
        start = int(torch.randint(0, n, (), generator=g))
        rows = int(torch.randint(1, n - start + 1, (), generator=g))
        members = pair_search.group_members(order, group_size)
        sq = torch.rand(rows, n - start, generator=g)
        expected = sq.clone()
        for r in range(rows):
            for c in range(n - start):
                if order[start + c] // group_size == order[start + r] // group_size:
                    expected[r, c] = math.inf
        pair_search.mask_own_groups(sq, start, members)
        assert torch.equal(sq, expected)

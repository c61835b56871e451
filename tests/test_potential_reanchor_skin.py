"""The neighbour list's re-anchoring skin follows the points' speed: a list built while the
points were slow (a small skin) searches the points that start to move faster again with the
skin their new speed calls for, so each mover is re-anchored every few updates instead of at
almost every one. Exact at every update (against all pairs, and the losses against their
dense path), the work proportional to the moving points (counts, no timing), and a
long-maintained list and a fresh one give bit-identical results."""

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pml_fieldlosses.losses.potential.neighbor_list import NeighborList

from .helpers import pair_set
from .naive_potential import check_dense_reference
from .test_potential_neighbor_list import make_loss, true_close_pairs

CUTOFF, MAX_SKIN, GROUP = 0.3, 0.3, 2


def sphere(n, dim, generator, dtype=torch.float64):
    return torch.nn.functional.normalize(torch.randn(n, dim, generator=generator, dtype=dtype), dim=1)


def slow_build(neighbors, points, generator, speed=0.001, updates=3):
    """Updates while every point moves ``speed``, then a build at that measured speed (as the
    list's own rebuilds do once too many points fail): the list's skin is the smallest."""
    for _ in range(updates):
        neighbors.update(points, GROUP, CUTOFF, MAX_SKIN)
        points = walk(points, torch.ones(len(points), dtype=torch.bool), speed, generator)
    neighbors.update(points, GROUP, CUTOFF, MAX_SKIN)  # measures the speed
    neighbors._build(points, GROUP, CUTOFF, MAX_SKIN)
    return points


def walk(points, moving, speed, generator, direction=None):
    """The ``moving`` points take a step of length ``speed`` in ``direction`` (default: random)."""
    if direction is None:
        direction = torch.randn(points.shape, generator=generator, dtype=points.dtype)
    step = torch.nn.functional.normalize(direction, dim=1)
    return torch.nn.functional.normalize(points + speed * step * moving.unsqueeze(1), dim=1)


def check_exact(neighbors, points, returned):
    """Every pair within the cutoff is returned; every clearance is a lower bound of the
    reference distance to every unlisted point of another group."""
    n = len(points)
    groups = torch.arange(n) // GROUP
    found = torch.zeros(n, n, dtype=torch.bool)
    found[returned[0], returned[1]] = True
    assert not (true_close_pairs(points, GROUP, CUTOFF) & ~found).any()
    listed = torch.zeros(n, n, dtype=torch.bool)
    listed[neighbors.state.pairs[0], neighbors.state.pairs[1]] = True
    reference = neighbors.state.reference.double()
    unlisted = (groups[:, None] != groups[None]) & ~(listed | listed.T)
    nearest = torch.where(unlisted, torch.cdist(reference, reference), torch.inf).amin(dim=1)
    assert (neighbors.state.clearance.double() <= nearest).all()


def fast_phase(neighbors, points, moving, speed, updates, generator, check=True):
    """``updates`` updates while the ``moving`` points move ``speed`` each; returns the number of
    re-anchorings."""
    before = neighbors.stats.num_reanchored
    builds = neighbors.stats.num_builds
    direction = torch.randn(points.shape, generator=generator, dtype=points.dtype)  # drifting, as under Adam
    for _ in range(updates):
        points = walk(points, moving, speed, generator, direction)
        returned = neighbors.update(points, GROUP, CUTOFF, MAX_SKIN)
        if check:
            check_exact(neighbors, points, returned)
    assert neighbors.stats.num_builds == builds  # the list was followed throughout
    return neighbors.stats.num_reanchored - before


def test_movers_are_reanchored_with_the_skin_their_speed_calls_for():
    """Built while every point moved 0.001 per update (skin 0.019), then a fifth of the points
    drift 0.006 per update for 40 updates: each mover is re-anchored about every
    target_steps / 2 updates (the skin 16 x 0.006 = 0.096), not about every 3 updates as with the
    build's skin; and the work is proportional to the moving points (twice the movers, about
    twice the re-anchorings). Exact at every update."""
    counts = {}
    for fraction in (0.2, 0.4):
        for grow in (True, False):
            g = torch.Generator().manual_seed(3)
            neighbors = NeighborList(chunk_entries=4099, pair_cost=1)
            points = slow_build(neighbors, sphere(600, 3, g), g)
            assert neighbors.state.skin == MAX_SKIN / 16
            if not grow:  # as before the re-anchoring skin followed the speed
                neighbors.state.largest_skin = neighbors.state.skin
            moving = torch.rand(len(points), generator=g) < fraction
            counts[fraction, grow] = fast_phase(neighbors, points, moving, 0.006, 40, g)
            if grow:
                assert neighbors.state.skin > 3 * MAX_SKIN / 16
    for fraction in (0.2, 0.4):
        movers = fraction * 600
        assert counts[fraction, True] < 40 / 3 * movers  # at most every 3 updates (about every 4 to 8)
        assert counts[fraction, True] < counts[fraction, False] / 2.5, counts
    assert 1.4 < counts[0.4, True] / counts[0.2, True] < 2.8


def test_a_shrunk_build_caps_the_reanchoring_skin():
    """A build whose list would exceed max_pairs shrinks its radius; re-anchoring never searches
    with a larger skin than that (the list would outgrow its limit and build again)."""
    g = torch.Generator().manual_seed(5)
    neighbors = NeighborList(chunk_entries=4099, pair_cost=20.0)
    points = sphere(300, 3, g)
    neighbors.update(points, GROUP, CUTOFF, MAX_SKIN)
    shrunk = neighbors.state.largest_skin
    assert neighbors.state.kept and shrunk < MAX_SKIN
    fast_phase(neighbors, points, torch.rand(300, generator=g) < 0.3, 0.01, 10, g)
    assert neighbors.state.skin <= shrunk and neighbors.stats.num_partial_rebuilds > 0


@settings(max_examples=6, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    dim=st.integers(2, 8),
    fraction=st.floats(0.1, 0.9),
    slow=st.floats(0.0005, 0.004),
    fast=st.floats(0.005, 0.04),
)
def test_list_stays_exact_as_the_speed_changes(seed, dim, fraction, slow, fast):
    """Property: whatever the speeds before and after the build and the share of movers, every
    update returns every pair within the cutoff and keeps every clearance valid."""
    g = torch.Generator().manual_seed(seed)
    neighbors = NeighborList(chunk_entries=997, pair_cost=1)
    points = slow_build(neighbors, sphere(160, dim, g, torch.float32), g, speed=slow)
    moving = torch.rand(len(points), generator=g) < fraction
    points = walk(points, moving, fast, g)
    for _ in range(12):
        returned = neighbors.update(points, GROUP, CUTOFF, MAX_SKIN)
        check_exact(neighbors, points, returned)
        points = walk(points, moving, fast * float(torch.rand(1, generator=g)) * 2, g)


def speed_up(loss_fn, generator, steps=12):
    """Adam on the proxies, first slow (the list is built at that speed), then fast; every step
    checked against the dense path (float64, 1e-12)."""
    C, _, D = loss_fn.proxies.shape
    x, labels = (
        torch.randn(16, D, generator=generator, dtype=torch.float64),
        torch.randint(0, C, (16,), generator=generator),
    )
    neighbors = loss_fn.neighbor_list
    for lr, phase_steps in [(0.002, 3), (0.05, steps)]:
        optimizer = torch.optim.Adam(loss_fn.parameters(), lr=lr)
        for _ in range(phase_steps):
            optimizer.zero_grad()
            xg = x.clone().requires_grad_()
            loss = loss_fn(xg, labels)
            loss.backward()
            check_dense_reference(loss_fn, x, labels, loss, [xg.grad, loss_fn.proxies.grad])
            optimizer.step()
        if lr < 0.01:
            with torch.no_grad():
                neighbors._build(
                    loss_fn.proxy_points(loss_fn.proxies.reshape(-1, D)), *list_settings(loss_fn)
                )
            built_skin = neighbors.state.skin
    return x, labels, built_skin


def list_settings(loss_fn):
    state = loss_fn.neighbor_list.state
    return state.group_size, state.cutoff, state.max_skin


def test_losses_match_their_dense_path_after_the_speed_grows_and_a_fresh_list_agrees():
    """The scalable path against the dense one at every step of a run that speeds up after a
    slow build (the re-anchoring skin grows); then a fresh loss loaded with the proxies gives
    bit-identical values and gradients."""
    for name in ("PFML", "CPML"):
        g = torch.Generator().manual_seed(len(name))
        loss_fn = make_loss(name)
        x, labels, built_skin = speed_up(loss_fn, g)
        assert loss_fn.neighbor_list.state.skin > built_skin
        assert loss_fn.neighbor_list.stats.num_partial_rebuilds > 0
        fresh = make_loss(name)
        fresh.load_state_dict(loss_fn.state_dict())
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        loss1, loss2 = loss_fn(x1, labels), fresh(x2, labels)
        assert torch.equal(loss1, loss2)
        grads1 = torch.autograd.grad(loss1, [x1, loss_fn.proxies])
        grads2 = torch.autograd.grad(loss2, [x2, fresh.proxies])
        assert all(torch.equal(a, b) for a, b in zip(grads1, grads2))


def recorded_reanchorings(neighbors):
    """The ``moved`` masks of the list's re-anchorings from now on."""
    log, reanchor = [], neighbors._reanchor

    def recording(points, moved, needed):
        log.append(moved.clone())
        reanchor(points, moved, needed)

    neighbors._reanchor = recording
    return log


def test_a_reanchoring_lists_the_pairs_that_would_make_the_other_points_fail():
    """A re-anchoring's search lists, beyond its radius, the pairs that would lower the
    clearance of a point it does not search below what that point needs to pass its test: so
    every point passes after it, and the update makes one search where a search without that
    listing (the same list, from the same state) needs a second one for the points it made
    fail. The points with such pairs are due: re-anchored first at the next update. Exact at
    every update, with the same pairs as without the listing."""
    g = torch.Generator().manual_seed(1)
    neighbors = NeighborList(chunk_entries=4099, pair_cost=1)
    points = slow_build(neighbors, sphere(600, 2, g), g)
    direction = torch.randn(points.shape, generator=g, dtype=points.dtype)
    one_instead_of_two = with_due = 0
    for _ in range(30):
        points = walk(points, torch.ones(len(points), dtype=torch.bool), 0.004, g, direction)
        without = copy.deepcopy(neighbors)
        without._search = lambda rows, others, build, needed=None: NeighborList._search(
            without, rows, others, build
        )
        due = neighbors.state.due.clone()
        searches, second = recorded_reanchorings(neighbors), recorded_reanchorings(without)
        returned = neighbors.update(points, GROUP, CUTOFF, MAX_SKIN)
        assert pair_set(returned) == pair_set(without.update(points, GROUP, CUTOFF, MAX_SKIN))
        check_exact(neighbors, points, returned)
        state = neighbors.state
        displacements = torch.linalg.vector_norm(points - state.reference, dim=1)
        assert not neighbors._beyond_allowance(displacements, state.clearance).any()
        del neighbors._reanchor
        assert len(searches) <= 1
        if due.any():
            with_due += 1
            assert len(searches) == 1 and not (due & ~searches[0]).any()
        if len(searches) == 1 and len(second) >= 2:
            one_instead_of_two += 1
    assert one_instead_of_two >= 2 and with_due >= 2

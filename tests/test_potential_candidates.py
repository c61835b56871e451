"""The scalable path's searches and its pair distances (pml_fieldlosses/losses/potential):
the candidate pairs found by one matrix product of the embeddings with all points, and the
pairs of proxies of one class, contain every pair off its plateau by the exact distances
(property-based, clustered and coincident points included); the closed-form gradient of the
pair distances equals autograd's; and the scalable path equals the dense path in float64
where those searches leave pairs out (embeddings on their own proxies, classes whose proxies
are all within delta)."""

import copy
import gc
import pickle
import subprocess
import sys
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pml_fieldlosses import losses
from pml_fieldlosses.losses.potential import distances
from pml_fieldlosses.losses.potential.candidates import class_pairs, embedding_candidates
from pml_fieldlosses.losses.potential.distances import (
    Bfloat16Factors,
    DifferencesBuffer,
    PairSqDistances,
    entries_below,
    pair_differences,
    pair_sq_distances_in_blocks,
    padded_rows,
)
from pml_fieldlosses.losses.potential.energy import pair_energies

from .helpers import assert_close, gradients, pair_set
from .naive_potential import check_dense_reference


def clustered_points(seed, num_points, dim, spread, dtype):
    """Points on the unit sphere in a few tight clusters (some coincident), so that pairs fall
    on both sides of the radii."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, dim, generator=g, dtype=torch.float64)
    points = centres[torch.randint(0, 3, (num_points,), generator=g)]
    points = points + spread * torch.randn(num_points, dim, generator=g, dtype=torch.float64)
    points[1] = points[0]  # a coincident pair
    return torch.nn.functional.normalize(points, dim=1).to(dtype)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch_size=st.integers(1, 12),
    num_classes=st.integers(1, 5),
    proxies_per_class=st.integers(1, 3),
    spread=st.sampled_from([0.01, 0.1, 0.3, 1.0]),
    delta=st.sampled_from([0.05, 0.3, 0.8]),
    repulsion_delta=st.sampled_from([0.05, 0.4, 1.2]),
    chunk_entries=st.sampled_from([1, 16, 2**22]),
    precision=st.sampled_from(["float32", "float32-bfloat16-products", "float64"]),
    all_rows=st.booleans(),
)
def test_candidates_contain_every_pair_off_its_plateau(
    seed,
    batch_size,
    num_classes,
    proxies_per_class,
    spread,
    delta,
    repulsion_delta,
    chunk_entries,
    precision,
    all_rows,
):
    """Every pair with an embedding in it, and every pair of two proxies of one class, whose
    exact (coordinate-difference, float64) distance is off its plateau is a candidate: a
    same-class pair farther than delta, a pair of different classes closer than
    repulsion_delta, also when the products are bfloat16; with every point a row (the search of
    all pairs, in blocks of rows against the later points), every pair off its plateau. Each
    block's pairs are (i < j), each pair once."""
    dtype = torch.float64 if precision == "float64" else torch.float32
    B, M, D = batch_size, proxies_per_class, 6
    n = num_classes * M
    points = clustered_points(seed, B + n, D, spread, dtype)
    g = torch.Generator().manual_seed(seed + 1)
    labels = torch.randint(0, num_classes, (B,), generator=g)
    point_labels = torch.cat([labels, torch.arange(num_classes).repeat_interleave(M)])
    proxies = points[B:]
    num_rows = B + n if all_rows else B

    bfloat16 = precision == "float32-bfloat16-products"
    factors = Bfloat16Factors().update(points, num_rows, 2**17) if bfloat16 else None
    blocks, _ = embedding_candidates(
        points, B, point_labels, M, delta, repulsion_delta, chunk_entries, factors, num_rows=num_rows
    )
    for block in blocks:
        assert (block[0] < block[1]).all()
        keys = block[0] * (B + n) + block[1]
        assert len(keys.unique()) == len(keys)
    found = pair_set(torch.cat(blocks, dim=1))
    within_class = class_pairs(proxies, M, delta, chunk_entries)
    assert (within_class[0] < within_class[1]).all()
    assert (point_labels[B + within_class[0]] == point_labels[B + within_class[1]]).all()
    found_within_class = pair_set(within_class + B)

    exact = points.double()
    sq = (exact.unsqueeze(1) - exact.unsqueeze(0)).pow(2).sum(dim=2)
    same = point_labels.unsqueeze(1) == point_labels.unsqueeze(0)
    off = torch.where(same, sq > delta**2, sq < repulsion_delta**2)
    for i, j in off.triu(diagonal=1).nonzero().tolist():
        if i < num_rows:
            assert (i, j) in found, (i, j, sq[i, j].item())
        elif same[i, j]:
            assert (i, j) in found_within_class, (i, j, sq[i, j].item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, step", [(1, 1), (5, 1), (5, 2), (5, 5), (5, 8), (130, 17), (130, 64)])
def test_upper_sq_distances_are_one_products_entries_above_the_diagonal(n, step, dtype):
    """upper_sq_distances in blocks of ``step`` rows: above the diagonal, the squared distances
    within the rounding slack the searches allow for (the entries of one product of all points
    with all points, sq_distance_block, wherever the matrix library sums the products of a
    block's entry in the same order: a single row may take another kernel); +inf on and below
    it, within the diagonal blocks too."""
    g = torch.Generator().manual_seed(n + step)
    points = torch.randn(n, 24, generator=g, dtype=dtype)
    sq_norms = torch.linalg.vector_norm(points, dim=1).square()
    whole = distances.sq_distance_block(points, sq_norms, points, sq_norms)
    sq = distances.upper_sq_distances(points, sq_norms, step)
    upper = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)  # (row, column): pairs i < j
    exact = (points.double().unsqueeze(1) - points.double().unsqueeze(0)).pow(2).sum(dim=2)
    slack = distances.rounding_slack(sq_norms.max().sqrt().item(), points.shape[1], dtype)
    assert ((sq[upper].double() - exact[upper]).abs() <= slack).all()
    assert ((whole[upper].double() - exact[upper]).abs() <= slack).all()
    assert torch.isinf(sq[~upper]).all() and (sq[~upper] > 0).all()


@pytest.mark.parametrize("n, step", [(1, 1), (5, 1), (5, 2), (5, 5), (5, 8), (130, 17), (130, 64)])
def test_bfloat16_upper_bounds_bound_the_distances_above_the_diagonal(n, step):
    """Bfloat16Factors.upper_lower_bounds (the search of all pairs with bfloat16 products) in
    blocks of ``step`` rows: above the diagonal, lower bounds of the squared distances, within
    the width of them below ``near`` (as lower_bounds of every row), with the same values as
    lower_bounds of the whole square there but for rounding of the products' sums; +inf on and
    below it. The output is kept and rewritten: the same at a second call, also after another
    ``step`` and after the caller wrote into it."""
    g = torch.Generator().manual_seed(n + step)
    points = torch.nn.functional.normalize(torch.randn(n, 40, generator=g), dim=1)
    factors = Bfloat16Factors().update(points, n, 2**10)
    exact = (points.double().unsqueeze(1) - points.double().unsqueeze(0)).pow(2).sum(dim=2)
    upper = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)  # (row, column): pairs i < j
    for near in [0.0, 0.16, 1.0, 2.0]:
        scale, shift, width = factors.bounds(near)
        other = factors.upper_lower_bounds(scale, shift, max(1, step // 2)).clone()
        factors.upper_lower_bounds(scale, shift, step).fill_(-1.0)  # a caller's writes
        lower = factors.upper_lower_bounds(scale, shift, step)
        assert lower.dtype == torch.float32 and lower.shape == (n, n)
        assert torch.equal(torch.isinf(other), torch.isinf(lower))
        whole = factors.lower_bounds(0, n, 0, scale, shift)
        lower, whole = lower.double(), whole.double()
        assert (lower[upper] <= exact[upper]).all()
        below = upper & (lower < near)
        assert (exact[below] <= lower[below] + width).all(), (near, width)
        # one bfloat16 rounding of the same sum in another order apart, at most
        assert ((lower[upper] - whole[upper]).abs() <= 2.0**-7 * whole[upper].abs() + 1e-6).all()
        assert torch.isinf(lower[~upper]).all() and (lower[~upper] > 0).all()


@pytest.mark.parametrize("M", [1, 2, 3, 5])
def test_class_pairs_are_those_whose_differences_square_above_the_threshold(M):
    """class_pairs: exactly the pairs (i < j) of one class whose ((p_i - p_j) ** 2).sum() (the
    energies' expression) exceeds delta^2 minus the rounding slack, in class-major order, for
    blocks of several classes or of one."""
    g = torch.Generator().manual_seed(M)
    N, D = 37, 20
    proxies = torch.nn.functional.normalize(torch.randn(N * M, D, generator=g), dim=1)
    first, second = torch.triu_indices(M, M, 1)
    grouped = proxies.view(N, M, D)
    sq = (grouped[:, first] - grouped[:, second]).pow(2).sum(dim=2)
    for delta in [0.0, sq.median().item() ** 0.5 if sq.numel() else 1.0, 3.0]:
        classes, which = (sq > delta**2 - distances.squared_distance_slack(proxies)).nonzero().unbind(1)
        expected = torch.stack([classes * M + first[which], classes * M + second[which]])
        for gather_entries in [D, 5 * D, 2**18]:
            assert torch.equal(class_pairs(proxies, M, delta, gather_entries), expected)


def at_distance(point, distance, generator):
    """A unit vector at ``distance`` from the unit vector ``point`` (float64)."""
    other = torch.randn(point.shape, generator=generator, dtype=torch.float64)
    other = torch.nn.functional.normalize(other - (other @ point) * point, dim=0)
    cos = 1 - distance**2 / 2
    return cos * point + (1 - cos**2) ** 0.5 * other


@pytest.mark.parametrize("dim", [64, 512])
def test_bfloat16_products_find_the_pairs_just_off_their_plateau(dim):
    """Pairs placed just off their plateau (an embedding's own proxies 0.01-1 % beyond delta,
    other classes' proxies as much within repulsion_delta), where a bfloat16 product's
    rounding alone (a few thousandths in squared distance) would misjudge them: all are candidates
    with bfloat16 products, and the pairs just on their plateau add no more than float32
    products find."""
    g = torch.Generator().manual_seed(dim)
    B, delta, repulsion_delta = 8, 0.4, 0.5
    embeddings = torch.nn.functional.normalize(torch.randn(B, dim, generator=g, dtype=torch.float64), dim=1)
    ratios = [1.0001, 1.001, 1.01]
    proxies, labels = [], []
    for i, e in enumerate(embeddings):
        for r in ratios:  # own class beyond delta, class B + i within repulsion_delta; both off plateau
            proxies += [at_distance(e, delta * r, g), at_distance(e, repulsion_delta / r, g)]
            labels += [i, B + i]
    order = torch.tensor(labels).argsort(stable=True)  # class-major
    points = torch.cat([embeddings, torch.stack(proxies)[order]]).float()
    point_labels = torch.cat([torch.arange(B), torch.tensor(labels)[order]])
    exact = points.double()
    sq = (exact.unsqueeze(1) - exact.unsqueeze(0)).pow(2).sum(dim=2)[:B]
    same = point_labels[:B].unsqueeze(1) == point_labels.unsqueeze(0)
    off = torch.where(same, sq > delta**2, sq < repulsion_delta**2)
    off &= torch.arange(B + len(proxies)).unsqueeze(0) > torch.arange(B).unsqueeze(1)
    required = pair_set(off.nonzero().T)
    assert len(required) >= 2 * B * len(ratios)
    found = {}
    for name, factors in [("float32", None), ("bfloat16", Bfloat16Factors().update(points, B, 2**17))]:
        blocks, undecided = embedding_candidates(
            points, B, point_labels, len(ratios), delta, repulsion_delta, 2**22, factors
        )
        found[name] = pair_set(torch.cat(blocks, dim=1))
        assert required <= found[name], name
        # the pairs near the thresholds are what bfloat16 products leave to float32
        assert (undecided >= len(required)) == (factors is not None), (name, undecided)
    assert found["bfloat16"] == found["float32"]


@pytest.mark.parametrize("dim", [1, 6, 64, 512])
@pytest.mark.parametrize("kind", ["unit", "clustered", "scaled", "exact-in-bfloat16", "tiny-and-zero"])
def test_bfloat16_factors_bound_every_squared_distance(dim, kind):
    """Bfloat16Factors: for every pair of rows and columns, the lower bound is at most the exact
    squared distance of the float32 points (float64), and the lower bound plus the width at
    least it wherever the lower bound is below ``near``, for several ``near``; at D = 512 on
    unit vectors the width near a cutoff of 0.4 is a few thousandths (the products' rounding
    relative to the norms would be about 0.05)."""
    g = torch.Generator().manual_seed(dim)
    n, num_rows = 300, 40
    if kind == "unit":
        points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    elif kind == "clustered":
        points = clustered_points(dim, n, dim, 0.05, torch.float32)
    elif kind == "scaled":
        points = 1e3 * torch.randn(n, dim, generator=g)
    elif kind == "exact-in-bfloat16":
        points = torch.randint(-8, 8, (n, dim), generator=g).float() / 4
    else:
        points = torch.randn(n, dim, generator=g) * torch.tensor([0.0, 1e-30, 1e-3, 1.0]).repeat(
            n // 4
        ).unsqueeze(1)
    points[1] = points[0]  # a coincident pair
    factors = Bfloat16Factors().update(points, num_rows, 2**10)  # several blocks of rows
    exact = points.double()
    sq = (exact[:num_rows].unsqueeze(1) - exact.unsqueeze(0)).pow(2).sum(dim=2)
    typical = sq.median().item()
    for near in [0.0, 0.16, typical / 2, typical, 2 * typical]:
        scale, shift, width = factors.bounds(near)
        for start, stop in [(0, num_rows), (7, 18), (0, 37)]:  # products of padded rows too
            lower = factors.lower_bounds(start, stop, 5, scale, shift).double()
            assert lower.dtype == torch.float64 and lower.shape == (stop - start, n - 5)
            truth = sq[start:stop, 5:]
            assert (lower <= truth).all(), (near, (lower - truth).max().item())
            below = lower < near
            assert (truth[below] <= lower[below] + width).all(), (near, width)
    if kind == "unit" and dim == 512:
        assert factors.bounds(0.4**2)[2] < 0.01


def test_bfloat16_factors_of_the_later_points_are_views_with_the_same_bounds():
    """Bfloat16Factors.tail: the factors of the points from some index on, every point a row,
    bound their squared distances (as the neighbour list's dense steps use the loss's)."""
    g = torch.Generator().manual_seed(3)
    points = torch.nn.functional.normalize(torch.randn(90, 16, generator=g), dim=1)
    factors = Bfloat16Factors().update(points, 90, 2**10)
    tail = factors.tail(30)
    assert tail.rows.data_ptr() == factors.rows[30:].data_ptr() and tail.radius == factors.radius
    exact = points[30:].double()
    sq = (exact.unsqueeze(1) - exact.unsqueeze(0)).pow(2).sum(dim=2)
    scale, shift, width = tail.bounds(0.5)
    lower = tail.lower_bounds(0, 60, 0, scale, shift).double()
    assert (lower <= sq).all() and (sq[lower < 0.5] <= lower[lower < 0.5] + width).all()


@pytest.mark.parametrize("dim", [1, 28, 60, 512])
def test_bfloat16_factors_rows_start_on_cache_lines_and_bound_the_distances(dim):
    """The factors' rows and columns are views of buffers whose rows are whole 64-byte lines
    (D + 4 numbers rounded up to a multiple of 32), through updates that grow the rows and
    change the points; the products of those views bound the points' squared distances."""
    g = torch.Generator().manual_seed(dim)
    factors = Bfloat16Factors()
    for n, num_rows in [(100, 10), (100, 60), (130, 60), (130, 5)]:
        points = torch.randn(n, dim, generator=g)
        factors.update(points, num_rows, 2**10)
        for part in (factors.rows, factors.columns, factors._row_buffer):
            assert part.shape[1] == dim + 4 and part.stride() == (-(-(dim + 4) // 32) * 32, 1)
            assert part.data_ptr() % 64 == 0
        assert factors.rows.shape[0] == num_rows and factors.columns.shape[0] == n
        assert factors.columns[:, dim : dim + 2].eq(1).all() and factors.rows[:, dim + 2 :].eq(1).all()
        exact = points[:num_rows].double().unsqueeze(1).sub(points.double().unsqueeze(0)).pow(2).sum(dim=2)
        near = exact.median().item()
        scale, shift, width = factors.bounds(near)
        lower = factors.lower_bounds(0, num_rows, 0, scale, shift).double()
        assert (lower <= exact).all() and (exact[lower < near] <= lower[lower < near] + width).all()


def assert_same_factors(factors, expected):
    """Two Bfloat16Factors with the same rows, columns and bounds, bit for bit."""
    assert torch.equal(factors.rows, expected.rows) and torch.equal(factors.columns, expected.columns)
    assert (factors.radius, factors.error) == (expected.radius, expected.error)


@pytest.mark.parametrize("dim", [1, 28, 512])
def test_bfloat16_factors_rounded_again_in_part_and_gathered_equal_fresh_ones(dim):
    """Bfloat16Factors.update_rows (only some points changed, one of them to the largest norm
    or residual, or all of them, or none) and gathered (the columns in another order, its
    first rows as rows): the same rows, columns, radius and error, bit for bit, as the
    factors of the points in that order made from scratch (as the neighbour list keeps the
    factors of its reference positions and gathers them for each re-anchoring's search)."""
    g = torch.Generator().manual_seed(dim)
    n = 150
    points = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    kept, search = Bfloat16Factors().update(points, 0, 2**10), Bfloat16Factors()
    for changed in [
        torch.tensor([3, 140, 7]),
        torch.arange(n),
        torch.tensor([], dtype=torch.long),
        torch.arange(0, n, 2),
    ]:
        points = points.clone()
        points[changed] = (
            torch.randn(len(changed), dim, generator=g) * torch.rand(len(changed), 1, generator=g) * 3
        )
        kept.update_rows(changed, points[changed], 2**10)
        assert_same_factors(kept, Bfloat16Factors().update(points, 0, 2**10))
        for num_rows in [1, 40, n]:
            order = torch.randperm(n, generator=g)
            search.gathered(kept, order, num_rows)
            assert_same_factors(search, Bfloat16Factors().update(points[order], num_rows, 2**10))
            scale, shift, _ = search.bounds(0.3)
            lower = search.lower_bounds(0, num_rows, 0, scale, shift).double()
            exact = points[order[:num_rows]].double().unsqueeze(1) - points[order].double().unsqueeze(0)
            assert (lower <= exact.pow(2).sum(dim=2)).all()


@pytest.mark.parametrize("share", [0.0, 1e-4, 0.01, 0.5, 1.0])
@pytest.mark.parametrize("nan_every", [7, 997])
def test_entries_below_equal_nonzero(share, nan_every):
    """entries_below: the same indices, in the same order, as (sq < threshold).nonzero(), for
    masks from empty to full, with NaN and inf entries (in every tile, or in a few) and empty
    blocks, whole tiles or not, scanned whole or tile by tile."""
    g = torch.Generator().manual_seed(int(share * 1e4) + nan_every)
    for shape in [(0, 5), (5, 0), (1, 1), (3, 100), (37, 101), (300, 40), (64, 128), (400, 333)]:
        sq = 1 + torch.rand(shape, generator=g)
        sq[torch.rand(shape, generator=g) < share] = 0.5
        if sq.numel():
            sq.view(-1)[::nan_every] = float("nan")
            sq.view(-1)[3 :: nan_every + 4] = float("inf")
        expected = (sq < 0.9).nonzero().unbind(1)
        for tile in [1, 8, 64]:
            assert all(torch.equal(a, b) for a, b in zip(entries_below(sq, 0.9, tile), expected))


def test_entries_below_scans_the_whole_mask_off_the_cpu(monkeypatch):
    """Off the CPU (a GPU: screens_tiles) entries_below makes no tiles: the same indices from
    one scan of the mask, where on a CPU it screens the tiles of a large block."""
    assert distances.screens_tiles(torch.device("cpu"))
    assert not distances.screens_tiles(torch.device("cuda"))
    g = torch.Generator().manual_seed(5)
    sq = 1 + torch.rand(300, 200, generator=g)
    sq[torch.rand(300, 200, generator=g) < 0.001] = 0.5
    expected = (sq < 0.9).nonzero().unbind(1)
    screened = []
    real_amin = torch.Tensor.amin

    def amin(tensor, *args, **kwargs):
        screened.append(tensor.shape)
        return real_amin(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "amin", amin)
    assert all(torch.equal(a, b) for a, b in zip(entries_below(sq, 0.9), expected))
    assert screened == [(300 * 200 // 64, 64)]  # the CPU's tiles
    screened.clear()
    monkeypatch.setattr(distances, "screens_tiles", lambda device: False)
    assert all(torch.equal(a, b) for a, b in zip(entries_below(sq, 0.9), expected))
    assert screened == []


def test_distances_in_blocks_keep_no_memory_per_block():
    """Pair distances evaluated block by block (a build among millions of close pairs, the
    proxies of one class) do not grow the process by a block's temporaries per block: in a
    fresh process, 1 563 blocks of pairs and 223 of classes grow its peak memory by a few MB,
    not the 1 GB that small per-block results, each allocated between two blocks' temporaries,
    pinned in the C allocator's heap."""
    script = (
        "import resource, torch\n"
        "from pml_fieldlosses.losses.potential.candidates import class_pairs\n"
        "from pml_fieldlosses.losses.potential.distances import pair_sq_distances_in_blocks\n"
        "points = torch.randn(2000, 512)\n"
        "pairs = torch.randint(0, 2000, (2, 400_000))\n"
        "proxies = torch.nn.functional.normalize(torch.randn(2000 * 8, 512), dim=1)\n"
        "pair_sq_distances_in_blocks(points, pairs[:, :1000], 2**17)\n"
        "class_pairs(proxies[:800], 8, 0.1, 2**17)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "sq = pair_sq_distances_in_blocks(points, pairs, 2**17)\n"
        "class_pairs(proxies, 8, 0.1, 2**17)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) < 16  # MB: 0 measured; the per-block lists grew it by 1 042 and 62


def test_padded_rows_are_few_shapes_at_most_a_quarter_larger():
    sizes = [padded_rows(k) for k in range(1, 5000)]
    assert all(k <= size <= max(k * 5 // 4, k) for k, size in zip(range(1, 5000), sizes))
    assert sorted(set(sizes)) == sorted(set(padded_rows(size) for size in sizes))  # idempotent
    assert len(set(sizes)) < 60


def plain_pair_sq_distances(points, pairs):
    """||p_i - p_j||^2 of the (2, K) ``pairs`` as autograd's plain expression: the rows
    gathered, their difference squared and summed."""
    ends = torch.nn.functional.embedding(pairs, points)
    return torch.sum((ends[0] - ends[1]).pow(2), dim=1)


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "computed-again"])
@pytest.mark.parametrize("num_pairs", [0, 1, 40])
def test_pair_sq_distances_gradient_in_closed_form_equals_autograd(num_pairs, keep):
    """PairSqDistances: the same values as plain_pair_sq_distances and the same gradient as autograd
    through it (repeated points, a pair of a point with itself), and gradcheck in float64, with
    the differences kept for the backward pass or computed again there."""
    g = torch.Generator().manual_seed(num_pairs)
    points = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    pairs = torch.randint(0, 7, (2, num_pairs), generator=g)
    if num_pairs:
        pairs[:, 0] = 3  # a point with itself: zero distance, zero gradient
    weights = torch.randn(num_pairs, generator=g, dtype=torch.float64)

    ours = PairSqDistances.apply(points, pairs, 2**17, keep)
    reference = plain_pair_sq_distances(points, pairs)
    assert torch.equal(ours, reference)
    (grad,) = gradients((ours * weights).sum(), [points]) if num_pairs else (torch.zeros(7, 5),)
    (expected,) = gradients((reference * weights).sum(), [points]) if num_pairs else (torch.zeros(7, 5),)
    assert_close(grad, expected, torch.float64)
    if num_pairs:
        assert torch.autograd.gradcheck(lambda p: PairSqDistances.apply(p, pairs, 2**17, keep), (points,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_pair_sq_distances_backward_twice_through_one_graph(dtype):
    """PairSqDistances' backward scales its saved differences in place: a second backward through
    the same graph (retain_graph) computes them again and gives the first one's gradient, bit for
    bit, with other upstream gradients too."""
    g = torch.Generator().manual_seed(3)
    points = torch.randn(30, 16, generator=g, dtype=dtype, requires_grad=True)
    pairs = torch.randint(0, 30, (2, 200), generator=g)
    weights, others = torch.randn(2, 200, generator=g, dtype=dtype)
    sq = PairSqDistances.apply(points, pairs, 5 * 16)
    (first,) = torch.autograd.grad(sq, [points], weights, retain_graph=True)
    (second,) = torch.autograd.grad(sq, [points], weights, retain_graph=True)
    (third,) = torch.autograd.grad(sq, [points], others)
    (plain,) = torch.autograd.grad(plain_pair_sq_distances(points, pairs), [points], others)
    assert torch.equal(first, second)
    assert_close(third, plain, dtype)


@pytest.mark.parametrize("dim", [3, 17, 512])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_blocked_pair_sq_distances_equal_the_plain_ones_bit_for_bit(dtype, dim):
    """PairSqDistances and pair_sq_distances_in_blocks (ends gathered into kept buffers, squares
    as x * x) give plain_pair_sq_distances' values (gathered ends, x.pow(2)) bit for bit, at sizes
    whose reductions take torch's vectorised paths, with blocks that do not divide the pairs."""
    g = torch.Generator().manual_seed(dim)
    points = torch.randn(300, dim, generator=g, dtype=dtype) * 10 ** torch.rand(
        300, 1, generator=g, dtype=dtype
    )
    pairs = torch.randint(0, 300, (2, 1500), generator=g)
    reference = plain_pair_sq_distances(points, pairs)
    for gather_entries in [dim, 7 * dim + 1, 2**18]:
        assert torch.equal(PairSqDistances.apply(points, pairs, gather_entries), reference), gather_entries
        assert torch.equal(pair_sq_distances_in_blocks(points, pairs, gather_entries), reference), (
            gather_entries
        )


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "computed-again"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_pair_sq_distances_in_blocks_equal_one_block_bit_for_bit(dtype, keep):
    """PairSqDistances gathers ``gather_entries`` coordinates at a time: any block size gives
    the values and gradients of one block, bit for bit (each point's gradient added up in the
    same order), so the block size changes the memory a step touches, never the result; so
    does computing the differences again in the backward pass instead of keeping them."""
    g = torch.Generator().manual_seed(5)
    points = torch.randn(30, 16, generator=g, dtype=dtype, requires_grad=True)
    pairs = torch.randint(0, 30, (2, 200), generator=g)
    weights = torch.randn(200, generator=g, dtype=dtype)
    whole = PairSqDistances.apply(points, pairs, 200 * 16)
    (whole_grad,) = torch.autograd.grad(whole, [points], weights)
    for gather_entries in [1, 16, 17, 5 * 16, 199 * 16]:
        blocks = PairSqDistances.apply(points, pairs, gather_entries, keep)
        (grad,) = torch.autograd.grad(blocks, [points], weights)
        assert torch.equal(blocks, whole) and torch.equal(grad, whole_grad), gather_entries


def pair_energies_inputs(seed, num_pairs, dtype):
    """pair_energies' inputs: 40 points of 16 coordinates (requiring a gradient), ``num_pairs``
    random pairs, a third of them of one class, PFML's potential at delta 0.5, and weights
    for a gradient of the energies."""
    g = torch.Generator().manual_seed(seed)
    points = torch.randn(40, 16, generator=g, dtype=dtype, requires_grad=True)
    pairs = torch.randint(0, 40, (2, num_pairs), generator=g)
    same = torch.rand(num_pairs, generator=g) < 0.3
    potential = losses.PotentialFieldLoss(4, 16, delta=0.5).pair_potential()
    return points, pairs, same, potential, torch.randn(40, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_pair_energies_in_several_blocks_keep_no_differences(dtype, monkeypatch):
    """pair_energies with more pairs than one block of ``chunk_entries`` coordinates: no block's
    K x D coordinate differences is alive between the forward and the backward pass (each is
    computed again in its block's backward pass, one block at a time), and the energies and
    gradients are those of one block (up to the order of the blocks' sums). With one block they
    are kept."""
    made = []

    def recorded(points, pairs, gather_entries, out=None):
        diff, sq = pair_differences(points, pairs, gather_entries, out)
        made.append(weakref.ref(diff))
        return diff, sq

    monkeypatch.setattr(distances, "pair_differences", recorded)
    points, pairs, same, potential, weights = pair_energies_inputs(11, 500, dtype)
    results = {}
    for chunk_entries in [500 * 16, 64 * 16]:  # one block; eight blocks
        made.clear()
        energies = pair_energies(points, pairs, same, potential, chunk_entries, 5 * 16)
        gc.collect()
        alive = sum(ref() is not None for ref in made)
        assert alive == (1 if chunk_entries == 500 * 16 else 0), (chunk_entries, alive, len(made))
        (grad,) = torch.autograd.grad(energies, [points], weights)
        results[chunk_entries] = energies, grad
    (one, one_grad), (several, several_grad) = results.values()
    assert_close(several, one, dtype)
    assert_close(several_grad, one_grad, dtype)


def test_differences_buffer_lends_its_memory_to_one_pass_at_a_time():
    """DifferencesBuffer.take: a view of one kept memory of ``entries`` coordinates (written at
    the first call), lent to one pass at a time: a second tensor taken while the first is alive
    is new memory; once the first is gone the kept memory is lent again. Differences larger than
    ``entries`` and points off the CPU take new memory; another dtype, or ``entries`` grown past
    the memory, make the memory anew."""
    buffer = DifferencesBuffer(100)
    points = torch.randn(10, 8)
    first = buffer.take(5, points)
    memory = buffer._memory
    assert first.shape == (5, 8) and first.data_ptr() == memory.data_ptr() and len(memory) == 100
    second = buffer.take(5, points)
    assert second.shape == (5, 8) and not _shares_memory(second, memory)
    del first
    gc.collect()
    third = buffer.take(12, points)
    assert third.shape == (12, 8) and third.data_ptr() == memory.data_ptr()
    del third
    assert not _shares_memory(buffer.take(13, points), memory)  # 104 coordinates
    assert buffer.take(3, points.to("meta")).device.type == "meta"
    wider = buffer.take(3, points.double())
    assert wider.dtype == torch.float64 and buffer._memory.dtype == torch.float64
    assert wider.data_ptr() == buffer._memory.data_ptr()
    del wider
    buffer.entries = 200
    grown = buffer.take(13, points.double())
    assert len(buffer._memory) == 200 and grown.data_ptr() == buffer._memory.data_ptr()
    del grown
    for copied in (pickle.loads(pickle.dumps(buffer)), copy.deepcopy(buffer)):
        assert copied._memory is None and copied.entries == 200
        assert copied.take(5, points).shape == (5, 8)


@pytest.mark.parametrize("loss_name", ["PotentialFieldLoss", "ContrastivePotentialLoss"])
@pytest.mark.parametrize("chunk_entries", [2**14, 2**22])
def test_a_loss_keeps_its_pairs_differences_in_one_memory(loss_name, chunk_entries):
    """On a CPU a loss's pairs' differences are views of one memory, made at its first step and
    kept (DifferencesBuffer), of ``chunk_entries`` coordinates or, if fewer, those of all pairs
    of its points."""
    g = torch.Generator().manual_seed(8)
    loss_fn = getattr(losses, loss_name)(20, 8, delta=0.9, dense=False)
    loss_fn.chunk_entries = chunk_entries
    memories = []
    for _ in range(2):
        x, labels = torch.randn(16, 8, generator=g, requires_grad=True), torch.randint(0, 20, (16,), generator=g)
        loss_fn(x, labels).backward()
        memories.append(loss_fn._differences._memory)
    P = 16 + 20 * loss_fn.proxies_per_class
    assert memories[0] is memories[1] and len(memories[0]) == min(chunk_entries, P * (P - 1) // 2 * 8)


def _shares_memory(tensor, memory):
    start, end = memory.data_ptr(), memory.data_ptr() + memory.numel() * memory.element_size()
    return start <= tensor.data_ptr() < end


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_pair_energies_with_a_differences_buffer_equal_those_without_bit_for_bit(dtype):
    """pair_energies keeping one block's differences in a DifferencesBuffer: the same energies
    and gradients, bit for bit, as in a new tensor, also for a second backward pass through the
    same graph (retain_graph), which finds the kept differences scaled and computes them again;
    the buffer's memory is lent again at the next call."""
    points, pairs, same, potential, weights = pair_energies_inputs(12, 300, dtype)
    expected = pair_energies(points, pairs, same, potential, 2**13, 5 * 16)
    (expected_grad,) = torch.autograd.grad(expected, [points], weights)
    buffer = DifferencesBuffer(2**13)
    for _ in range(2):
        energies = pair_energies(points, pairs, same, potential, 2**13, 5 * 16, buffer)
        for _ in range(2):
            (grad,) = torch.autograd.grad(energies, [points], weights, retain_graph=True)
            assert torch.equal(energies, expected) and torch.equal(grad, expected_grad)
        assert buffer._memory is not None and len(buffer._memory) == 2**13
        del energies
        gc.collect()
        assert buffer._lent() is None


@pytest.mark.parametrize("loss_name", ["PotentialFieldLoss", "ContrastivePotentialLoss"])
def test_a_used_loss_pickles_and_deep_copies(loss_name):
    """After a forward pass (its caches filled, its graph alive) a loss pickles (as Ray and
    multiprocessing send it) and deep-copies, and the copy gives the same loss."""
    g = torch.Generator().manual_seed(6)
    loss_fn = getattr(losses, loss_name)(20, 8, delta=0.6, dense=False)
    x, labels = torch.randn(16, 8, generator=g, requires_grad=True), torch.randint(0, 20, (16,), generator=g)
    loss = loss_fn(x, labels)
    for copied in (pickle.loads(pickle.dumps(loss_fn)), copy.deepcopy(loss_fn)):
        assert torch.equal(copied(x, labels), loss)


@pytest.mark.parametrize("loss_name", ["PotentialFieldLoss", "ContrastivePotentialLoss"])
def test_two_forward_passes_before_one_backward_pass_give_each_its_own_gradient(loss_name):
    """A loss called twice before one backward pass (two batches' losses added up): the second
    call overwrites nothing the first graph holds (the buffers the losses keep between calls
    serve their searches only), so the gradients are those of two separate backward passes."""
    g = torch.Generator().manual_seed(4)
    loss_fn = getattr(losses, loss_name)(20, 8, delta=0.6, dense=False).double()
    batches = [
        (torch.randn(16, 8, generator=g, dtype=torch.float64), torch.randint(0, 20, (16,), generator=g))
        for _ in range(2)
    ]
    separate = []
    for x, labels in batches:
        x.requires_grad_(True)
        loss_fn.zero_grad()
        loss_fn(x, labels).backward()
        separate.append(x.grad.clone())
        x.grad = None
    loss_fn.zero_grad()
    total = sum(loss_fn(x, labels) for x, labels in batches)
    total.backward()
    assert torch.equal(batches[0][0].grad, separate[0]) and torch.equal(batches[1][0].grad, separate[1])


@pytest.mark.parametrize("loss_name", ["PotentialFieldLoss", "ContrastivePotentialLoss"])
def test_pairs_left_out_by_the_searches_are_exact_zeros(loss_name):
    """Embeddings on (or within delta of) their own proxies, and classes whose proxies all lie
    within delta of each other, leave those pairs out of the candidates; the scalable path
    still equals the dense path (float64, value and gradients), and its counted pairs are
    fewer than the B M own-proxy pairs plus the intra-class pairs."""
    g = torch.Generator().manual_seed(5)
    N, M, D = 6, 3, 8
    loss_fn = getattr(losses, loss_name)(N, D, proxies_per_class=M, delta=0.3, dense=False).double()
    centres = torch.nn.functional.normalize(torch.randn(N, 1, D, generator=g, dtype=torch.float64), dim=2)
    proxies = centres + 0.01 * torch.randn(N, M, D, generator=g, dtype=torch.float64)
    proxies[4] = torch.randn(M, D, generator=g, dtype=torch.float64)  # one class spread out
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    labels = torch.tensor([0, 0, 1, 2, 2, 4, 5])
    x = proxies[labels, 0] + 0.001 * torch.randn(len(labels), D, generator=g, dtype=torch.float64)
    x[0] = proxies[0, 1]  # exactly on a proxy of its class
    x = x.requires_grad_()
    loss_fn.collect_stats = True
    loss = loss_fn(x, labels)
    grads = gradients(loss, [x, loss_fn.proxies])
    check_dense_reference(loss_fn, x, labels, loss, grads)
    assert loss_fn.num_attraction_pairs < len(labels) * M + N * M * (M - 1) // 2


@pytest.mark.parametrize("loss_name", ["PotentialFieldLoss", "ContrastivePotentialLoss"])
def test_no_pair_off_its_plateau_still_has_zero_gradients(loss_name):
    """Every embedding on its own (single) proxy and the classes far apart: no pair is off its
    plateau, so the searches return none; the loss still has a graph, and backward gives the
    dense path's exact zero gradients for the embeddings and the proxies."""
    N, D = 4, 8
    loss_fn = getattr(losses, loss_name)(N, D, proxies_per_class=1, delta=0.3, dense=False).double()
    proxies = torch.eye(N, D, dtype=torch.float64).unsqueeze(1)
    with torch.no_grad():
        loss_fn.proxies.copy_(proxies)
    labels = torch.tensor([0, 0, 2, 3])
    x = proxies[labels, 0].clone().requires_grad_()
    loss_fn.collect_stats = True
    loss = loss_fn(x, labels)
    assert loss_fn.num_attraction_pairs == loss_fn.num_repulsion_pairs == 0
    grads = gradients(loss, [x, loss_fn.proxies])
    assert all(torch.equal(grad, torch.zeros_like(grad)) for grad in grads)
    check_dense_reference(loss_fn, x, labels, loss, grads)

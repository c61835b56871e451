"""The searches of the scalable path (no gradient): the pairs that may be off their plateau,
a superset, with a margin for the rounding of the matrix products. See docs/derivations.md,
"The potential energy and its plateau decomposition" (the candidates, by kind of pair) and
"The pair search and the neighbour list's certificates" (Rounding margins). The pairs of two
proxies of different classes come from a pair search (pair_search.py, neighbor_list.py), or,
for few points, from one search of all pairs here (embedding_candidates with every point a row).

Points are numbered as in energy.py: the B embeddings, then the N M proxies, class-major."""

import itertools
import math

import torch

from .distances import (
    block_rows,
    entries_below,
    mask_earlier_columns,
    pair_sq_distances_in_blocks,
    rounding_slack,
    sq_distance_block,
    squared_distance_slack,
    upper_sq_distances,
)


def embedding_candidates(
    points,
    num_embeddings,
    point_labels,
    proxies_per_class,
    delta,
    repulsion_delta,
    chunk_entries,
    factors=None,
    gather_entries=2**18,
    num_rows=None,
):
    """The candidate pairs (i < j) with an embedding in them, as a list of (2, K) index tensors
    (one per block of rows, in no particular order: canonical_order sorts them all), and how
    many entries bfloat16
    products left undecided (0 without them): same-class pairs that may be farther
    apart than ``delta`` and pairs of different classes that may be closer than
    ``repulsion_delta`` (``points``: the ``num_embeddings`` embeddings, then the proxies as
    points, (B + N M, D), class-major: ``proxies_per_class`` of each class, their labels
    ascending). One matrix product of the
    embeddings with all points per block of at most about ``chunk_entries`` entries, one rule
    for every kind of pair: an embedding's own proxies are candidates only when they may be
    farther than ``delta``, like any same-class pair. The few same-class entries of a row (its
    class's embeddings and proxies) are enumerated from the labels, so that a block is read
    once, for the pairs that may be within ``repulsion_delta``.

    ``factors``: the points' Bfloat16Factors (float32 ``points``, the embeddings as rows), for
    a product several times faster on CPUs with bfloat16 instructions, whose bounds are a few
    thousandths apart in squared distance near the thresholds: the pairs they leave
    undecided are evaluated from their float32 coordinates (``gather_entries`` coordinates at a
    time), so the candidates are the same as with a float32 product.

    ``num_rows``: the candidate pairs whose first point is among the first ``num_rows``
    points (default: the embeddings); all points: every candidate pair, proxies of one class
    and of different classes too, in one product of all points with all points (``factors``
    then with every point a row)."""
    B = num_embeddings
    num_rows = B if num_rows is None else num_rows
    norms = torch.linalg.vector_norm(points, dim=1)
    max_norm = norms.max().item()
    slack = rounding_slack(max_norm, points.shape[1], points.dtype)
    att_threshold = delta**2 - slack
    rep_threshold = repulsion_delta**2 + slack
    low_slack = 0.0  # how far a product's value may be from the squared distance (bfloat16)
    if factors is not None:
        scale, shift, width = factors.bounds(max(att_threshold, rep_threshold))
        # the middle of each entry's bounds, within half their width of its squared distance
        shift, low_slack = shift - width / 2, width / 2
    sq_norms = norms.square()
    step = max(1, chunk_entries // len(points))
    pairs, undecided = [], 0
    for start in range(0, num_rows, step):
        stop = min(start + step, num_rows)
        if stop - start == len(points) and points.device.type == "cpu":
            # a search of all pairs in one block, on a CPU: about the upper triangle's products
            # (a GPU, bound by kernel launches, takes the one product of all the square's); in
            # bfloat16 at least 4 blocks (block_rows), as the dense sweeps' (row_blocks)
            if factors is None:
                sq = upper_sq_distances(points, sq_norms, block_rows(len(points), chunk_entries))
            else:
                step_rows = block_rows(len(points), chunk_entries, min_blocks=4)
                sq = factors.upper_lower_bounds(scale, shift, step_rows)
        else:
            if factors is None:
                sq = sq_distance_block(points[start:stop], sq_norms[start:stop], points, sq_norms)
            else:
                sq = factors.lower_bounds(start, stop, 0, scale, shift)
            mask_earlier_columns(sq, start)  # (upper_* did so for their blocks)
        row_same, col_same = same_class_entries(point_labels, B, proxies_per_class, start, stop)
        sq_same = sq[row_same, col_same]
        # pairs of different classes that may be within repulsion_delta: the entries below it, once
        # the row's own class's (near it, read above) are +inf too: every finite entry left is a
        # pair i < j of different classes
        sq[row_same, col_same] = math.inf
        row, col = entries_below(sq, rep_threshold + low_slack)
        near, near_undecided = decide(
            points, start, row, col, sq[row, col], low_slack, lambda sq: sq < rep_threshold, gather_entries
        )
        # pairs of one class that may be farther than delta
        far, far_undecided = decide(
            points,
            start,
            row_same,
            col_same,
            sq_same,
            -low_slack,
            lambda sq: sq > att_threshold,
            gather_entries,
        )
        undecided += near_undecided + far_undecided
        # one boolean mask over both kinds of entries (a GPU waits for each)
        entries = torch.cat([torch.stack([row, col]), torch.stack([row_same, col_same])], 1)
        found = entries[:, torch.cat([near, far])]
        found[0] += start
        pairs.append(found)
    return pairs, undecided


def decide(points, start, row, col, sq, low_slack, is_candidate, gather_entries):
    """Which of the entries (row, col) of a block (rows from ``start``) with product values
    ``sq`` are candidates by ``is_candidate`` (a test of a float32 squared distance): with
    bfloat16 products (``low_slack`` != 0: how far the test's threshold moves for the product's
    margin), the entries whose value is within the margin of the threshold are evaluated from
    their float32 coordinates (exact near 0, as the energies compute them), ``gather_entries``
    coordinates at a time. Returns the mask and how many were evaluated again."""
    if low_slack == 0:
        return is_candidate(sq), 0
    certain = is_candidate(sq + low_slack)
    undecided = (~certain & is_candidate(sq - low_slack)).nonzero().squeeze(1)
    if len(undecided):
        pairs = torch.stack([row[undecided] + start, col[undecided]])
        certain[undecided] = is_candidate(pair_sq_distances_in_blocks(points, pairs, gather_entries))
    return certain, len(undecided)


def same_class_entries(point_labels, num_embeddings, proxies_per_class, start, stop):
    """The entries (row, col) of the block of points ``start:stop`` (rows from 0) against
    all points that are pairs (i < j) of one class: later embeddings of the row's class, and
    its class's later proxies (of the ``proxies_per_class`` columns from B + M label: the
    proxies are class-major, M of each class; all of them for an embedding's row)."""
    B, M = num_embeddings, proxies_per_class
    labels = point_labels[start:stop]
    # (rows of embeddings only: a proxy comes after every embedding)
    rows = torch.arange(start, max(start, min(stop, B)), device=labels.device)
    later = torch.arange(B, device=labels.device) > rows.unsqueeze(1)
    row_embedded, col_embedded = (
        ((labels[: len(rows)].unsqueeze(1) == point_labels[:B]) & later).nonzero().unbind(1)
    )
    row_proxy = torch.arange(stop - start, device=labels.device).repeat_interleave(M)
    col_proxy = (labels.unsqueeze(1) * M + B + torch.arange(M, device=labels.device)).view(-1)
    if stop > B:  # proxies among the rows: their class's earlier proxies and themselves are not pairs
        later = col_proxy > row_proxy + start
        row_proxy, col_proxy = row_proxy[later], col_proxy[later]
    return torch.cat([row_embedded, row_proxy]), torch.cat([col_embedded, col_proxy])


def class_pairs(proxies, proxies_per_class, delta, gather_entries):
    """The pairs (i < j) of two proxies of one class (numbered as rows of ``proxies``, the
    proxies as points, (N M, D), class-major) that may be farther apart than ``delta``, by their
    coordinate differences (as the energies compute them), with a margin for rounding: the
    others are on the attraction plateau. One pair of places (a, b) within the classes at a
    time, the differences of the a-th and b-th proxy of every class taken from two strided
    views (no gathered copies), in blocks of at most about ``gather_entries`` coordinates
    (small temporaries, kept in the CPU's caches)."""
    M, D = proxies_per_class, proxies.shape[1]
    N = len(proxies) // M
    first, second = torch.triu_indices(M, M, 1, device=proxies.device)
    if len(first) == 0 or N == 0:
        return torch.empty(2, 0, dtype=torch.long, device=proxies.device)
    threshold = delta**2 - squared_distance_slack(proxies)
    grouped = proxies.view(N, M, D)
    step = max(1, gather_entries // max(D, 1))
    # written block by block into one mask (pair_sq_distances_in_blocks says why)
    far = torch.empty(N, len(first), dtype=torch.bool, device=proxies.device)
    sq = proxies.new_empty(N)
    scratch = proxies.new_empty(min(step, N), D)
    # (the places in triu_indices' order, made on the host: no tensor read back from a GPU)
    for pair, (a, b) in enumerate(itertools.combinations(range(M), 2)):
        for start in range(0, N, step):
            stop = min(start + step, N)
            diff = torch.sub(grouped[start:stop, a], grouped[start:stop, b], out=scratch[: stop - start])
            # (x * x: the bits of x.pow(2), which torch computes as that product)
            torch.sum(diff.mul_(diff), dim=1, out=sq[start:stop])
        torch.gt(sq, threshold, out=far[:, pair])
    classes, which = far.nonzero().unbind(1)
    return torch.stack([classes * M + first[which], classes * M + second[which]])


def canonical_order(pairs, point_labels):
    """The (2, K) candidate pairs sorted by their points, and their same-class mask: the sums
    do not depend on how the searches found them, and the extra candidates a neighbour list
    may hold add exact zeros, so the result does not depend on the list's history."""
    pairs = pairs[:, (pairs[0] * len(point_labels) + pairs[1]).argsort()]
    return pairs, point_labels[pairs[0]] == point_labels[pairs[1]]

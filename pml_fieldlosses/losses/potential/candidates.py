"""The searches of the scalable path (no gradient): the pairs that may be off their plateau,
a superset, with a margin for the rounding of the matrix products. See docs/derivations.md,
"The potential energy and its plateau decomposition" (the candidates, by kind of pair) and
"The pair search and the neighbour list's certificates" (Rounding margins). The pairs of two
proxies of different classes come from a pair search (pair_search.py, neighbor_list.py).

Points are numbered as in energy.py: the B embeddings, then the N M proxies, class-major."""

import torch

from .distances import rounding_slack, sq_distance_block, squared_distance_slack


def embedding_candidates(points, num_embeddings, point_labels, delta, repulsion_delta, chunk_entries):
    """The candidate pairs (i < j) with an embedding in them, as a list of (2, K) index tensors
    (one per block of rows, each in the canonical order): same-class pairs that may be farther
    apart than ``delta`` and pairs of different classes that may be closer than
    ``repulsion_delta`` (``points``: the ``num_embeddings`` embeddings, then the proxies as
    points, (B + N M, D)). One matrix product of the embeddings with all points per block of at
    most about ``chunk_entries`` entries, one rule for every kind of pair: an embedding's own
    proxies are candidates only when they may be farther than ``delta``, like any same-class
    pair."""
    B = num_embeddings
    embeddings = points[:B]
    norms = torch.linalg.vector_norm(points, dim=1)
    slack = rounding_slack(norms.max().item(), points.shape[1], points.dtype)
    att_threshold = delta**2 - slack
    rep_threshold = repulsion_delta**2 + slack
    sq_norms = norms.square()
    columns = torch.arange(len(points), device=points.device)
    step = max(1, chunk_entries // len(points))
    pairs = []
    for start in range(0, B, step):
        stop = min(start + step, B)
        sq = sq_distance_block(embeddings[start:stop], sq_norms[start:stop], points, sq_norms)
        same = point_labels[start:stop].unsqueeze(1) == point_labels.unsqueeze(0)
        close = torch.where(same, sq > att_threshold, sq < rep_threshold)
        # i < j: the upper triangle among the embeddings (every proxy comes after every embedding)
        close &= columns.unsqueeze(0) > columns[start:stop].unsqueeze(1)
        row, col = close.nonzero().unbind(1)
        pairs.append(torch.stack([row + start, col]))
    return pairs


def class_pairs(proxies, proxies_per_class, delta, gather_entries):
    """The pairs (i < j) of two proxies of one class (numbered as rows of ``proxies``, the
    proxies as points, (N M, D), class-major) that may be farther apart than ``delta``, by their
    coordinate differences (as the energies compute them), with a margin for rounding: the
    others are on the attraction plateau. In blocks of classes of at most about
    ``gather_entries`` gathered coordinates (small temporaries, kept in the CPU's caches)."""
    M, D = proxies_per_class, proxies.shape[1]
    N = len(proxies) // M
    first, second = torch.triu_indices(M, M, 1, device=proxies.device)
    if len(first) == 0 or N == 0:
        return torch.empty(2, 0, dtype=torch.long, device=proxies.device)
    threshold = delta**2 - squared_distance_slack(proxies)
    grouped = proxies.view(N, M, D)
    step = max(1, gather_entries // (len(first) * D))
    far = torch.cat(
        [
            (grouped[start : start + step, first] - grouped[start : start + step, second]).pow(2).sum(dim=2)
            > threshold
            for start in range(0, N, step)
        ]
    )
    classes, which = far.nonzero().unbind(1)
    return torch.stack([classes * M + first[which], classes * M + second[which]])


def canonical_order(pairs, point_labels):
    """The (2, K) candidate pairs sorted by their points, and their same-class mask: the sums
    do not depend on how the searches found them, and the extra candidates a neighbour list
    may hold add exact zeros, so the result does not depend on the list's history."""
    pairs = pairs[:, (pairs[0] * len(point_labels) + pairs[1]).argsort()]
    return pairs, point_labels[pairs[0]] == point_labels[pairs[1]]

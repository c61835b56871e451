"""The searches of the scalable path (no gradient): the pairs that may be off their plateau,
a superset, with a margin for the rounding of the matrix products. See docs/derivations.md,
"The potential energy and its plateau decomposition" (the candidates, by kind of pair) and
"The pair search and the neighbour list's certificates" (Rounding margins). The pairs of two
proxies of different classes come from a pair search (pair_search.py, neighbor_list.py).

Points are numbered as in energy.py: the B embeddings, then the N M proxies, class-major."""

import torch

from .distances import class_sq_distances, rounding_slack


def embedding_candidates(
    embeddings, proxies, point_labels, delta, repulsion_delta, proxies_per_class, chunk_entries
):
    """The candidate pairs (i < j) with an embedding in them, as a list of (2, K) index tensors:
    same-class pairs that may be farther apart than ``delta`` and pairs of different classes
    that may be closer than ``repulsion_delta`` (``proxies``: the proxies as points, (N M, D))."""
    B = len(embeddings)
    emb_norms = torch.linalg.vector_norm(embeddings, dim=1)
    proxy_norms = torch.linalg.vector_norm(proxies, dim=1)
    max_norm = torch.maximum(emb_norms.max(), proxy_norms.max()).item()
    slack = rounding_slack(max_norm, embeddings.shape[1], embeddings.dtype)
    att_threshold = delta**2 - slack
    rep_threshold = repulsion_delta**2 + slack
    emb_sq_norms, proxy_sq_norms = emb_norms.square(), proxy_norms.square()
    labels, proxy_labels = point_labels[:B], point_labels[B:]
    return [
        embedding_pairs(embeddings, labels, emb_sq_norms, att_threshold, rep_threshold),
        own_proxy_pairs(labels, proxies_per_class),
        *other_proxy_pairs(
            embeddings,
            proxies,
            labels,
            proxy_labels,
            emb_sq_norms,
            proxy_sq_norms,
            rep_threshold,
            chunk_entries,
        ),
    ]


def embedding_pairs(embeddings, labels, sq_norms, att_threshold, rep_threshold):
    """Pairs of embeddings (i < j): of one class above ``att_threshold`` or of different
    classes below ``rep_threshold`` (squared distances), from the B x B matrix product."""
    arange = torch.arange(len(embeddings), device=labels.device)
    sq = sq_norms.unsqueeze(1) + sq_norms.unsqueeze(0) - 2 * embeddings @ embeddings.T
    same = labels.unsqueeze(1) == labels.unsqueeze(0)
    upper = arange.unsqueeze(1) < arange.unsqueeze(0)
    return (upper & torch.where(same, sq > att_threshold, sq < rep_threshold)).nonzero().T


def own_proxy_pairs(labels, proxies_per_class):
    """Each embedding and every proxy of its class (B M pairs, no search)."""
    B, M = len(labels), proxies_per_class
    own = B + labels.unsqueeze(1) * M + torch.arange(M, device=labels.device)
    return torch.stack([torch.arange(B, device=labels.device).repeat_interleave(M), own.reshape(-1)])


def other_proxy_pairs(
    embeddings, proxies, labels, proxy_labels, emb_sq_norms, proxy_sq_norms, threshold, chunk_entries
):
    """Embeddings and the proxies of other classes below ``threshold`` (squared distance): one
    B x (N M) matrix product in blocks of rows of at most about ``chunk_entries`` entries.
    Returns one (2, K) tensor per block."""
    B = len(embeddings)
    step = max(1, chunk_entries // len(proxies))
    pairs = []
    for start in range(0, B, step):
        sq = torch.addmm(proxy_sq_norms.unsqueeze(0), embeddings[start : start + step], proxies.T, alpha=-2)
        sq += emb_sq_norms[start : start + step].unsqueeze(1)
        row, col = (sq < threshold).nonzero().unbind(1)
        row = row + start
        keep = labels[row] != proxy_labels[col]
        pairs.append(torch.stack([row[keep], B + col[keep]]))
    return pairs


def canonical_order(pairs, point_labels):
    """The (2, K) candidate pairs sorted by their points, and their same-class mask: the sums
    do not depend on how the searches found them, and the extra candidates a neighbour list
    may hold add exact zeros, so the result does not depend on the list's history."""
    pairs = pairs[:, (pairs[0] * len(point_labels) + pairs[1]).argsort()]
    return pairs, point_labels[pairs[0]] == point_labels[pairs[1]]


def attracting_classes(proxies, delta):
    """The classes (indices) whose proxies (N, M, D) may be farther apart than ``delta`` (a
    margin for rounding): only their pairs of two proxies of one class can be off the
    attraction plateau."""
    sq, sq_norms = class_sq_distances(proxies)
    max_norm = sq_norms.max().sqrt().item() if len(sq_norms) else 0.0
    threshold = delta**2 - rounding_slack(max_norm, proxies.shape[2], proxies.dtype)
    return (sq > threshold).flatten(1).any(dim=1).nonzero().squeeze(1)

"""Squared distances for the potential losses: by matrix products in blocks, with a margin for
their rounding (for the searches), and from coordinate differences (for the energies and the
pairs the searches return). See docs/derivations.md, "The pair search and the neighbour
list's certificates" (Rounding margins)."""

import contextlib

import torch


@contextlib.contextmanager
def full_precision_matmul():
    """Float32 matrix products in full precision within the block: the rounding bounds of the
    searches (rounding_slack) assume float32 products, not TF32 or bfloat16
    (``torch.set_float32_matmul_precision("high")``)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def pair_sq_distances(points, pairs):
    """||p_i - p_j||^2 of the (2, K) ``pairs`` from the coordinate differences (exact near 0).
    The rows are gathered with F.embedding (= points[indices]), whose backward is much faster
    on CPU than index_select's for repeated indices."""
    ends = torch.nn.functional.embedding(pairs, points)
    return (ends[0] - ends[1]).pow(2).sum(dim=1)


def pair_sq_distances_in_blocks(points, pairs, gather_entries):
    """pair_sq_distances in blocks of at most ``gather_entries`` gathered coordinates (small
    blocks stay in the CPU's caches; large fresh buffers cost page faults). No gradient."""
    step = max(1, gather_entries // points.shape[1])
    sq = [
        pair_sq_distances(points, pairs[:, start : start + step]) for start in range(0, pairs.shape[1], step)
    ]
    return torch.cat(sq) if sq else points.new_empty(0)


def rounding_slack(max_norm, dim, dtype):
    """An upper bound on the rounding error of ||a||^2 + ||b||^2 - 2 a.b computed in ``dtype``
    for points of norm <= ``max_norm`` in ``dim`` dimensions (a dot product of length D errs by
    at most about D eps ||a|| ||b||), with a safety factor of 2."""
    return 4 * (dim + 2) * torch.finfo(dtype).eps * max(max_norm**2, 1.0)


def squared_distance_slack(points):
    """rounding_slack for the rows of ``points``."""
    max_norm = torch.linalg.vector_norm(points, dim=1).max().item() if len(points) else 0.0
    return rounding_slack(max_norm, points.shape[1], points.dtype)


def class_sq_distances(proxies):
    """Squared distances among the proxies of each class, (N, M, D) -> (N, M, M), from the
    class's Gram matrix, and the proxies' squared norms (N, M): its diagonal, gathered by
    indexing all three dimensions. Not a diagonal view nor a slice-and-index: torch.compile's
    inductor (CPU) miscompiled the backward of both (2.14 reused the Gram matrix's buffer while
    still reading its diagonal view: wrong gradients; 2.13 mis-strided the scatter of
    x[:, index]: writes past the buffer)."""
    gram = torch.bmm(proxies, proxies.transpose(1, 2))
    classes = torch.arange(gram.shape[0], device=gram.device).unsqueeze(1)
    members = torch.arange(gram.shape[1], device=gram.device).unsqueeze(0)
    sq_norms = gram[classes, members, members]
    return sq_norms.unsqueeze(2) + sq_norms.unsqueeze(1) - 2 * gram, sq_norms


def augmented(points):
    """||a - b||^2 = [a, |a|^2, 1] . [-2b, 1, |b|^2]: the left and right factors, so that a
    block of squared distances is one matrix product."""
    sq_norms = torch.linalg.vector_norm(points, dim=1, keepdim=True).square()
    ones = torch.ones_like(sq_norms)
    return torch.cat([points, sq_norms, ones], dim=1), torch.cat([-2 * points, ones, sq_norms], dim=1)


def block_rows(n, chunk_entries):
    """Rows per block of a search of n points, each row against the later ones: at most
    ``chunk_entries`` entries, and at least 8 blocks, so the blocks cover about the upper
    triangle (n^2 / 2 entries plus one eighth of n^2 / 2) rather than the whole n x n square."""
    return max(1, min(chunk_entries // max(1, n), -(-n // 8)))


def row_blocks(points, num_rows, chunk_entries):
    """The squared distances of the first ``num_rows`` points to the later points, by matrix
    products in blocks of rows: yields (start, sq), sq[r, c] the squared distance of points
    start + r and start + c (entries with c <= r are not pairs of a row with a later point)."""
    left, right = augmented(points)
    step = block_rows(len(points), chunk_entries)
    for start in range(0, num_rows, step):
        yield start, left[start : min(start + step, num_rows)] @ right[start:].T

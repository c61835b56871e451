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


def kept_buffer(buffer, shape, like):
    """``buffer`` if it has ``shape`` and the dtype and device of ``like``, else a new empty
    tensor that does: memory kept between steps for temporaries written in place (a fresh
    tensor of tens of MB is new memory at every step, above the size the C allocator reuses,
    and its page faults cost more than the arithmetic)."""
    shape = torch.Size(shape)
    if buffer is None or (buffer.shape, buffer.dtype, buffer.device) != (shape, like.dtype, like.device):
        return like.new_empty(shape)
    return buffer


def pair_sq_distances(points, pairs):
    """||p_i - p_j||^2 of the (2, K) ``pairs`` from the coordinate differences (exact near 0).
    The rows are gathered with F.embedding (= points[indices]), whose backward is much faster
    on CPU than index_select's for repeated indices."""
    ends = torch.nn.functional.embedding(pairs, points)
    return (ends[0] - ends[1]).pow(2).sum(dim=1)


class PairSqDistances(torch.autograd.Function):
    """pair_sq_distances with its gradient in closed form: with diff = p_i - p_j, the gradient
    of g ||diff||^2 is 2 g diff for p_i and -2 g diff for p_j, added up per point by two
    index_adds (autograd's backward of the gather, the difference and the square makes several
    K x D temporaries and a gather backward). Same values; first derivatives only.

    The differences are saved in one K x D buffer, filled ``gather_entries`` coordinates at a
    time, and every other temporary has that size: on a CPU, K x D temporaries of a few MB each
    are fresh memory at every step (the allocator hands it back to the system between steps)
    and their page faults cost more than the arithmetic. Each pair's value and each point's
    gradient are computed as in one block, in the same order (bit for bit)."""

    @staticmethod
    def forward(ctx, points, pairs, gather_entries):
        step = max(1, gather_entries // points.shape[1])
        diff = points.new_empty(pairs.shape[1], points.shape[1])
        sq = points.new_empty(pairs.shape[1])
        for start in range(0, pairs.shape[1], step):
            block = pairs[:, start : start + step]
            ends = torch.nn.functional.embedding(block, points)
            torch.sub(ends[0], ends[1], out=diff[start : start + step])
            torch.sum(diff[start : start + step].pow(2), dim=1, out=sq[start : start + step])
        ctx.save_for_backward(diff, pairs)
        ctx.num_points, ctx.step = len(points), step
        return sq

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        diff, pairs = ctx.saved_tensors
        step, twice = ctx.step, 2 * grad
        grad_points = diff.new_zeros(ctx.num_points, diff.shape[1])
        # all first points, then all second points: the order of one index_add over each
        for side, sign in [(0, 1), (1, -1)]:
            for start in range(0, pairs.shape[1], step):
                terms = diff[start : start + step] * twice[start : start + step].unsqueeze(1)
                grad_points.index_add_(0, pairs[side, start : start + step], terms, alpha=sign)
        return grad_points, None, None


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


def block_rows(n, chunk_entries):
    """Rows per block of a search of n points, each row against the later ones: at most
    ``chunk_entries`` entries, and at least 8 blocks, so the blocks cover about the upper
    triangle (n^2 / 2 entries plus one eighth of n^2 / 2) rather than the whole n x n square."""
    return max(1, min(chunk_entries // max(1, n), -(-n // 8)))


def row_blocks(points, num_rows, chunk_entries):
    """The squared distances of the first ``num_rows`` points to the later points, by matrix
    products in blocks of rows: yields (start, sq), sq[r, c] the squared distance of points
    start + r and start + c (entries with c <= r are not pairs of a row with a later point)."""
    sq_norms = torch.linalg.vector_norm(points, dim=1).square()
    step = block_rows(len(points), chunk_entries)
    for start in range(0, num_rows, step):
        stop = min(start + step, num_rows)
        rows, row_sq_norms = points[start:stop], sq_norms[start:stop]
        yield start, sq_distance_block(rows, row_sq_norms, points[start:], sq_norms[start:])


def sq_distance_block(rows, row_sq_norms, columns, column_sq_norms):
    """||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b of each of ``rows`` against each of ``columns``,
    given their squared norms: one matrix product with the norms added to it (the expression
    whose rounding rounding_slack bounds; no augmented copies of the points)."""
    sq = torch.addmm(column_sq_norms.unsqueeze(0), rows, columns.T, alpha=-2)
    return sq.add_(row_sq_norms.unsqueeze(1))

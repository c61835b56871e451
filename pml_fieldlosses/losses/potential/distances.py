"""Squared distances for the potential losses: by matrix products in blocks, with a margin for
their rounding (for the searches), and from coordinate differences (for the energies and the
pairs the searches return). See docs/derivations.md, "The pair search and the neighbour
list's certificates" (Rounding margins)."""

import contextlib
import functools
import math
import time

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


def kept_buffer(buffer, shape, like, dtype=None):
    """``buffer`` if it has ``shape`` and the dtype (``dtype``, else ``like``'s) and device of
    ``like``, else a new empty tensor that does: memory kept between steps for temporaries
    written in place (a fresh tensor of tens of MB is new memory at every step, above the size
    the C allocator reuses, and its page faults cost more than the arithmetic)."""
    shape, dtype = torch.Size(shape), dtype or like.dtype
    if buffer is None or (buffer.shape, buffer.dtype, buffer.device) != (shape, dtype, like.device):
        return like.new_empty(shape, dtype=dtype)
    return buffer


def bfloat16_copy(buffer, points):
    """``points`` in bfloat16, written into ``buffer`` (``kept_buffer``: a new one if it does not
    fit): the searches' factors for bfloat16 products."""
    return kept_buffer(buffer, points.shape, points, torch.bfloat16).copy_(points)


@functools.lru_cache(maxsize=None)
def bfloat16_products_pay():
    """Whether a bfloat16 matrix product is at least twice as fast as a float32 one on this
    CPU (those with AVX512-BF16 or AMX instructions; elsewhere it is slower): measured once per
    process, on a product of the searches' shape (256 x 512 by 512 x 4 096), the best of three."""
    generator = torch.Generator().manual_seed(0)  # the global random state stays as it was
    a, b = torch.randn(256, 512, generator=generator), torch.randn(4096, 512, generator=generator)
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        torch.mm(x, y.T)  # warm-up
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            torch.mm(x, y.T)
            best = min(best, time.perf_counter() - start)
        seconds[dtype] = best
    return 2 * seconds[torch.bfloat16] <= seconds[torch.float32]


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


class Bfloat16Choice:
    """Whether a search's next products are bfloat16: they cost about a quarter of float32
    ones per entry, but every entry they leave undecided is evaluated again from its
    coordinates at ``pair_cost`` entries' cost. They are used while the share of entries the
    last bfloat16 products left undecided, times ``pair_cost``, stays below ``saving``; after
    a float32 choice, bfloat16 products are tried again every ``retry`` calls (the share
    changes as the points move). Products of fewer than ``min_multiply_adds`` stay float32:
    measured within training steps at N = 400 (256 x 1 056 x 512), a bfloat16 product saved
    nothing there."""

    saving = 0.5
    retry = 16
    min_multiply_adds = 2**28

    def __init__(self):
        self.undecided_share = 0.0  # of the last bfloat16 products' entries
        self.calls_since = 0  # float32 choices since the last bfloat16 products

    def use(self, pair_cost, multiply_adds):
        if multiply_adds < self.min_multiply_adds:
            return False
        if self.undecided_share * pair_cost < self.saving or self.calls_since + 1 >= self.retry:
            self.calls_since = 0
            return True
        self.calls_since += 1
        return False

    def observe(self, undecided, entries):
        self.undecided_share = undecided / max(entries, 1)


def bfloat16_rounding_slack(max_norm, dim):
    """An upper bound on the error of ||a||^2 + ||b||^2 - 2 a.b when a.b is a bfloat16 matrix
    product of float32 points of norm <= ``max_norm`` in ``dim`` dimensions: both factors
    rounded to bfloat16 (relative error <= u = 2^-8 each), their products (exact in float32)
    summed in float32 (<= gamma = dim 2^-24 / (1 - dim 2^-24) of the sum of their magnitudes),
    the sum rounded to bfloat16 (<= u); so |a.b - product| <= ((1 + u)^3 (1 + gamma) - 1)
    ||a|| ||b||, twice that in the squared distance, plus the float32 rounding of the rest
    (rounding_slack) and 2^-100 for values flushed to zero. See docs/derivations.md, "bfloat16
    products, with their own margin"."""
    u, eps = 2.0**-8, 2.0**-24
    gamma = dim * eps / (1 - dim * eps)
    dot = ((1 + u) ** 3 * (1 + gamma) - 1) * max_norm**2
    return 2 * dot + rounding_slack(max_norm, dim, torch.float32) + 2.0**-100


def block_rows(n, chunk_entries):
    """Rows per block of a search of n points, each row against the later ones: at most
    ``chunk_entries`` entries, and at least 8 blocks, so the blocks cover about the upper
    triangle (n^2 / 2 entries plus one eighth of n^2 / 2) rather than the whole n x n square."""
    return max(1, min(chunk_entries // max(1, n), -(-n // 8)))


def row_blocks(points, num_rows, chunk_entries, low_points=None):
    """The squared distances of the first ``num_rows`` points to the later points, by matrix
    products in blocks of rows: yields (start, sq, width), sq[r, c] for points start + r and
    start + c (entries with c <= r are not pairs of a row with a later point): their squared
    distance is within [sq - slack, sq + width + slack], slack = squared_distance_slack(points).

    Without ``low_points`` the products are float32 and width is 0. ``low_points``: the same
    float32 points in bfloat16, for products several times faster on CPUs with bfloat16
    instructions (bfloat16_products_pay); sq is then a lower bound and width twice
    bfloat16_rounding_slack (about 0.05): refine_below makes the entries a caller reads exact."""
    sq_norms = torch.linalg.vector_norm(points, dim=1).square()
    step = block_rows(len(points), chunk_entries)
    width = 0.0
    if low_points is not None:
        max_norm = sq_norms.max().sqrt().item() if len(points) else 0.0
        width = 2 * bfloat16_rounding_slack(max_norm, points.shape[1])
    product_points = points if low_points is None else low_points
    # the lower bound: the products' values less half the width (on the column norms: no pass)
    column_sq_norms = sq_norms - width / 2 if width else sq_norms
    for start in range(0, num_rows, step):
        stop = min(start + step, num_rows)
        rows, row_sq_norms = product_points[start:stop], sq_norms[start:stop]
        yield (
            start,
            sq_distance_block(rows, row_sq_norms, product_points[start:], column_sq_norms[start:]),
            width,
        )


def refine_below(points, start, sq, width, threshold, gather_entries):
    """Makes exact (within squared_distance_slack) every entry of a row_blocks block ``sq``
    (rows from ``start``) that its ``width`` leaves possibly below ``threshold``: those below
    it, evaluated from their float32 coordinates. The others are lower bounds of at least the
    threshold. Returns how many were evaluated (none for width 0: float32 products)."""
    if width == 0:
        return 0
    row, col = (sq < threshold).nonzero().unbind(1)
    sq[row, col] = pair_sq_distances_in_blocks(points, torch.stack([row, col]) + start, gather_entries)
    return len(row)


def sq_distance_block(rows, row_sq_norms, columns, column_sq_norms):
    """||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b of each of ``rows`` against each of ``columns``,
    given their squared norms: one matrix product with the norms added to it (the expression
    whose rounding rounding_slack bounds; no augmented copies of the points). Rows and columns
    in bfloat16 (the norms in float32): a bfloat16 product, the rest in float32 (the
    expression bfloat16_rounding_slack bounds)."""
    if rows.dtype == torch.bfloat16:
        # one pass: the bfloat16 product read as float32 by the addition
        sq = torch.add(column_sq_norms.unsqueeze(0), torch.mm(rows, columns.T), alpha=-2)
    else:
        sq = torch.addmm(column_sq_norms.unsqueeze(0), rows, columns.T, alpha=-2)
    return sq.add_(row_sq_norms.unsqueeze(1))

"""Squared distances for the potential losses: by matrix products in blocks, with a margin for
their rounding (for the searches), and from coordinate differences (for the energies and the
pairs the searches return). See docs/derivations.md, "The pair search and the neighbour
list's certificates" (Rounding margins)."""

import contextlib
import functools
import math
import time
import weakref

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


@functools.lru_cache(maxsize=None)
def bfloat16_products_pay():
    """Whether a bfloat16 matrix product is at least twice as fast as a float32 one on this
    CPU (those with AVX512-BF16 or AMX instructions; elsewhere it is slower): measured once per
    process, on a product of the searches' shape (256 x 512 by 512 x 4 096), the best of five
    of each, taken in turn (so that a moment of load from elsewhere slows both kinds, not the
    tries of one: on a CPU with AMX, where they pay about four times over, all three bfloat16
    tries of a run taken after the float32 ones once fell within a burst of another process
    and that run searched in float32)."""
    generator = torch.Generator().manual_seed(0)  # the global random state stays as it was
    a, b = torch.randn(256, 512, generator=generator), torch.randn(4096, 512, generator=generator)
    operands = {dtype: (a.to(dtype), b.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    best = dict.fromkeys(operands, math.inf)
    for attempt in range(6):  # the first of each: a warm-up
        for dtype, (x, y) in operands.items():
            start = time.perf_counter()
            torch.mm(x, y.T)
            if attempt:
                best[dtype] = min(best[dtype], time.perf_counter() - start)
    return 2 * best[torch.bfloat16] <= best[torch.float32]


def pair_sq_distances_into(points, pairs, diff, scratch, out):
    """||p_i - p_j||^2 of the (2, k) ``pairs`` written into ``out`` (k,), and p_i - p_j into
    ``diff`` (k, D); ``scratch`` (k, D) is overwritten (the second points gathered, then the
    squares). The values of ((points[pairs[0]] - points[pairs[1]]) ** 2).sum(1) bit for bit,
    with no temporary of its own: a fresh (k, D) tensor per block of a few MB is above the size
    glibc's allocator reuses until it has seen it freed, and early in training its page faults
    cost more than the arithmetic."""
    torch.index_select(points, 0, pairs[0], out=diff)
    diff.sub_(torch.index_select(points, 0, pairs[1], out=scratch))
    # (x * x: the bits of x.pow(2), which torch computes as that product)
    return torch.sum(torch.mul(diff, diff, out=scratch), dim=1, out=out)


class PairSqDistances(torch.autograd.Function):
    """||p_i - p_j||^2 of the (2, K) ``pairs`` from the coordinate differences (exact near 0),
    with its gradient in closed form: with diff = p_i - p_j, the gradient of g ||diff||^2 is
    2 g diff for p_i and -2 g diff for p_j, added up per point by two index_adds (autograd's
    backward of the gather, the difference and the square makes several K x D temporaries and
    a gather backward). The values of the plain expression ((points[i] - points[j]) ** 2).sum(1),
    bit for bit; first derivatives only.

    With ``keep_differences`` the differences are kept for the backward pass in one K x D
    buffer, filled ``gather_entries`` coordinates at a time, and the only other temporary is one
    block's size, written in place by every block: on a CPU, K x D temporaries of a few MB each
    are fresh memory at every step (the allocator hands it back to the system between steps)
    and their page faults cost more than the arithmetic. Without it (the caller's memory bound
    for many pairs) the forward pass writes the values only, and the backward pass computes the
    differences again from the saved points. The backward pass scales the differences in place
    into the terms 2 g diff and adds them up with one index_add per side: all first points,
    then all second points, each in the pairs' order, the order of one block (block by block,
    it took 28 operations per 512 pairs and about twice the time). A second backward pass
    through the same graph (retain_graph) finds the buffer scaled and computes the differences
    again. Each pair's value and each point's gradient are computed as in one block, in the
    same order (bit for bit). ``out``: a (K, D) tensor to keep the differences in (a loss's
    DifferencesBuffer), else a new one."""

    @staticmethod
    def forward(ctx, points, pairs, gather_entries, keep_differences=True, out=None):
        if keep_differences:
            diff, sq = pair_differences(points, pairs, gather_entries, out)
        else:
            diff, sq = None, pair_sq_distances_in_blocks(points, pairs, gather_entries)
        ctx.save_for_backward(points, pairs)
        ctx.diff, ctx.gather_entries = diff, gather_entries
        return sq

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        points, pairs = ctx.saved_tensors
        terms, ctx.diff = ctx.diff, None
        if terms is None:  # not kept, or scaled by an earlier backward pass: the differences again
            terms, _ = pair_differences(points, pairs, ctx.gather_entries)
        terms.mul_((2 * grad).unsqueeze(1))
        grad_points = terms.new_zeros(points.shape)
        grad_points.index_add_(0, pairs[0], terms)
        grad_points.index_add_(0, pairs[1], terms, alpha=-1)
        return grad_points, None, None, None, None


def pair_differences(points, pairs, gather_entries, out=None):
    """p_i - p_j (K, D) and ||p_i - p_j||^2 (K,) of the (2, K) ``pairs``, ``gather_entries``
    coordinates at a time (pair_sq_distances_into), with one block's scratch; the differences
    are written into ``out`` if given."""
    num_pairs, dim = pairs.shape[1], points.shape[1]
    step = max(1, gather_entries // dim)
    diff = points.new_empty(num_pairs, dim) if out is None else out
    sq = points.new_empty(num_pairs)
    scratch = points.new_empty(min(step, num_pairs), dim)
    for start in range(0, num_pairs, step):
        stop = min(start + step, num_pairs)
        pair_sq_distances_into(
            points, pairs[:, start:stop], diff[start:stop], scratch[: stop - start], sq[start:stop]
        )
    return diff, sq


class DifferencesBuffer:
    """Memory for the coordinate differences PairSqDistances keeps for its backward pass, kept
    by a loss between steps on a CPU. A step's K x D differences are tens of MB when many pairs
    are close (the first steps of a run, whose trunk bunches the batch), and a fresh tensor of
    that size is new memory whenever it is larger than any before: about one page fault per
    4 KB, 4 ms for 16 MB on 2 CPU cores, three times the arithmetic. So memory for the largest
    block there can be (``entries`` coordinates: the loss sets the smaller of its
    ``chunk_entries`` and all pairs of its points) is allocated and written once, at the first
    call, and every later block's differences are a view of it. It is lent to one forward pass
    at a time: while a tensor taken earlier is alive (a graph whose backward pass has not run
    yet), ``take`` returns a new tensor instead, so that no pass overwrites differences another
    one still needs. A cache: a copy or a pickle of it starts empty."""

    def __init__(self, entries=2**22):
        self.entries = entries
        self._memory = None
        self._lent = None  # a weak reference to the tensor taken last

    def take(self, num_pairs, points):
        """A (num_pairs, D) tensor like ``points`` for their differences: a view of the kept
        memory when ``points`` are on a CPU, the differences fit in ``entries`` coordinates and
        no tensor taken before is alive; else a new tensor (on a GPU the caching allocator
        reuses memory without page faults). The memory is made anew, of ``entries``
        coordinates, for another dtype or when ``entries`` has grown past it."""
        size = num_pairs * points.shape[1]
        lent = self._lent is not None and self._lent() is not None
        if points.device.type != "cpu" or size > self.entries or lent:
            return points.new_empty(num_pairs, points.shape[1])
        memory = self._memory
        if memory is None or memory.dtype != points.dtype or len(memory) < size:
            # written now (zeros), so that its page faults are paid once, at this first call;
            # an ordinary tensor also under torch.inference_mode()
            with torch.inference_mode(False):
                memory = self._memory = points.new_zeros(self.entries)
        taken = memory[:size].view(num_pairs, points.shape[1])
        self._lent = weakref.ref(taken)
        return taken

    def __getstate__(self):
        return {"entries": self.entries}

    def __setstate__(self, state):
        self.__init__(state["entries"])


def pair_sq_distances_in_blocks(points, pairs, gather_entries):
    """PairSqDistances' values without a gradient, in blocks of at most ``gather_entries``
    gathered coordinates (small blocks stay in the CPU's caches), each block's values written
    into one output, the blocks' differences into two buffers of one block's size
    (pair_sq_distances_into).
    (Kept as a list of small per-block results, each allocated between two blocks'
    temporaries, they would pin those in the C allocator's heap: about 0.5 MB per block, 16 GB
    for a build among 8 M close pairs.)"""
    num_pairs, dim = pairs.shape[1], points.shape[1]
    step = max(1, gather_entries // dim)
    sq = points.new_empty(num_pairs)
    first, second = points.new_empty(2, min(step, num_pairs), dim)
    for start in range(0, num_pairs, step):
        stop = min(start + step, num_pairs)
        size = stop - start
        pair_sq_distances_into(points, pairs[:, start:stop], first[:size], second[:size], sq[start:stop])
    return sq


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
    last bfloat16 products left undecided, times ``pair_cost``, stays below ``saving``. After
    a float32 choice they are tried again after ``retry`` calls (the share changes as the
    points move), and after each try that does not pay twice as many, up to ``max_retry``:
    the embeddings' search in the first steps, whose undecided entries thin out within a few
    steps, tries again soon; a dense step among many pairs just beyond its cutoff seldom.
    Products of fewer than
    ``min_multiply_adds`` stay float32: below it the factors' rounding of all points
    (Bfloat16Factors.update) costs about what the product saves (measured: 8 rows against
    1 056 points, 2^22 multiply-adds, 97 us in float32, 46 us in bfloat16)."""

    saving = 0.5
    retry = 4
    max_retry = 64
    min_multiply_adds = 2**24

    def __init__(self):
        self.undecided_share = 0.0  # of the last bfloat16 products' entries
        self.calls_since = 0  # float32 choices since the last bfloat16 products
        self.wait = self.retry  # calls until the next try
        self.trying = False  # the last bfloat16 products were a try (the last ones did not pay)
        self._pair_cost = 0.0  # of the last use

    def use(self, pair_cost, multiply_adds):
        if multiply_adds < self.min_multiply_adds:
            return False
        self._pair_cost = pair_cost
        self.trying = not self.pays(pair_cost)
        if not self.trying or self.calls_since + 1 >= self.wait:
            self.calls_since = 0
            return True
        self.calls_since += 1
        return False

    def pays(self, pair_cost):
        return self.undecided_share * pair_cost < self.saving

    def observe(self, undecided, entries):
        """The last bfloat16 products (after a use that returned True) left ``undecided`` of
        their ``entries`` to be evaluated again."""
        self.undecided_share = undecided / max(entries, 1)
        failed_try = self.trying and not self.pays(self._pair_cost)
        self.wait = min(2 * self.wait, self.max_retry) if failed_try else self.retry


def padded_rows(num_rows):
    """``num_rows`` rounded up to one of four sizes per power of 2 (at most a quarter more): the
    first bfloat16 product of each new shape costs about 1 ms on CPU (oneDNN makes a kernel for
    it; measured: 0.91 ms for a new number of rows against 800 columns, 0.10 ms after), and a
    re-anchoring's number of rows changes from step to step."""
    granularity = row_granularity(num_rows)
    return -(-num_rows // granularity) * granularity


def row_granularity(num_rows):
    """The spacing of padded_rows' sizes from ``num_rows``'s power of 2 to the next."""
    return 2 ** max(0, num_rows.bit_length() - 3)


def aligned_width(width):
    """``width`` rounded up to a multiple of 32: a row of that many bfloat16 numbers is a whole
    number of 64-byte cache lines."""
    return -(-width // 32) * 32


def aligned_rows(buffer, width):
    """The first ``width`` columns of ``buffer`` (rows of aligned_width(width)), a view whose
    rows start on 64-byte boundaries (the CPU allocator aligns the buffer itself to 64 bytes).
    oneDNN's bfloat16 products read such operands faster: measured on a CPU with AMX
    (torch 2.14.1, 2 threads), 256 rows against 1 056 columns of 516 took 0.20 ms with rows
    of 544 numbers and 0.26 ms packed, 2 000 against 2 000 columns of 132 0.65 and 1.01 ms; the
    product's arithmetic is the same (the padding is never read)."""
    return buffer[:, :width]


def round_columns(points, columns, gather_entries):
    """Writes the columns [p~, 1, 1, hi, lo] of float32 ``points`` (n, D) into ``columns`` (n, D + 4)
    bfloat16, whose ones are already there: p~ is p rounded to bfloat16, hi + lo its squared
    norm ||p~||^2 (Bfloat16Factors). Returns the squared norms ||p~||^2 and the residuals
    ||p - p~|| (n,) as computed in float32, in blocks of 4 ``gather_entries`` coordinates
    (float32 temporaries of at most a few MB). Each column's values depend on its own point
    only."""
    n, D = points.shape
    rounded = columns[:, :D].copy_(points)
    sq_norms, residuals = points.new_empty(n), points.new_empty(n)
    step = max(1, 4 * gather_entries // max(D, 1))
    for start in range(0, n, step):
        block = rounded[start : start + step].float()  # (a norm of the bfloat16 rows is slower)
        torch.linalg.vector_norm(block, dim=1, out=sq_norms[start : start + step])
        # p~ - p is exact in float32 (p~ is within a factor 2 of p, coordinate by coordinate)
        torch.linalg.vector_norm(
            block.sub_(points[start : start + step]), dim=1, out=residuals[start : start + step]
        )
    sq_norms.square_()
    high = sq_norms.to(torch.bfloat16)
    low = (sq_norms - high.float()).to(torch.bfloat16)  # the difference is exact in float32
    columns[:, D + 2 :] = torch.stack([high, low], dim=1)
    return sq_norms, residuals


class Bfloat16Factors:
    """Float32 points rounded to bfloat16, as the two factors of one matrix product whose
    entries are the squared distances of the rounded points: a row is [-2 p~, hi, lo, 1, 1]
    and a column [q~, 1, 1, hi', lo'], where p~ is p rounded to bfloat16 and hi + lo its
    squared norm ||p~||^2 split into two bfloat16 numbers, so that an entry is ||p~||^2 +
    ||q~||^2 - 2 p~.q~ = ||p~ - q~||^2, rounded once to bfloat16. The entries then bound the
    distances of the float32 points in distance, not in squared distance: ||p - q|| is within
    ``radius`` (the largest ||p - p~||, twice) of ||p~ - q~||, so near a cutoff r the bounds
    are about 4 r ``radius`` apart in squared distance, not the products' rounding relative to
    ||p|| ||q||. See docs/derivations.md, "bfloat16 products, with their own margin".

    The rows are the first ``num_rows`` points, the columns all of them (``update``); the
    buffers are kept between updates and written in place (kept_buffer)."""

    # |entry - its float32 sum| <= relative |entry|: one rounding to bfloat16 (unit roundoff
    # 2^-8, relative to the exact sum, so 2^-8 / (1 - 2^-8) relative to the entry)
    relative = 2.0**-8 * (1 + 2.0**-7)

    def __init__(self):
        self.rows = self.columns = None  # (num_rows, D + 4) and (n, D + 4) bfloat16
        self._row_buffer = None  # rows is a view of its first num_rows
        self._column_buffer = None  # columns is a view of it (aligned_rows)
        # (n,) float32: each column's ||p~||^2 and ||p - p~|| as computed in float32 (the bounds
        # take their largest: ``radius`` and ``error``)
        self.sq_norms = self.residuals = None
        self._block = None  # columns rounded again by update_rows, before they are put in place
        self._square = None  # upper_lower_bounds' (n, n) float32 output (kept: see there)
        self.radius = 0.0  # >= ||p - p~|| + ||q - q~|| for any two points
        self.error = 0.0  # >= |float32 sum of an entry's products - ||p~ - q~||^2|

    def update(self, points, num_rows, gather_entries):
        """The factors of float32 ``points`` (n, D) with their first ``num_rows`` as rows. Returns
        self. The residuals p - p~ are computed in blocks of 4 ``gather_entries`` coordinates
        (float32 temporaries of at most a few MB)."""
        n, D = points.shape
        buffer = kept_buffer(self._column_buffer, (n, aligned_width(D + 4)), points, torch.bfloat16)
        if buffer is not self._column_buffer:  # (the ones are written once per buffer)
            self._column_buffer = buffer
            self.columns = aligned_rows(buffer, D + 4)
            self.columns[:, D : D + 2] = 1
        self.sq_norms, self.residuals = round_columns(points, self.columns, gather_entries)
        self._set_bounds()
        self._set_rows(num_rows)
        return self

    def update_rows(self, index, points, gather_entries):
        """The factors after the points at ``index`` (distinct places in the order of the last
        ``update``) became ``points`` (len(index), D): only their columns are rounded again (the
        same values as an ``update`` of all the points: each column depends on its own point,
        the bounds on the largest of the columns' terms). The rows are left as they were
        (``gathered`` makes rows of its own). Returns self."""
        D = points.shape[1]
        needed, kept = len(index), self._block
        like = self._column_buffer
        if kept is None or len(kept) < needed or (kept.shape[1], kept.device) != (like.shape[1], like.device):
            kept = self._block = torch.empty_like(like[: max(needed, 1)])
            aligned_rows(kept, D + 4)[:, D : D + 2] = 1
        block = kept[:needed]
        sq_norms, residuals = round_columns(points, aligned_rows(block, D + 4), gather_entries)
        self._column_buffer.index_copy_(0, index, block)
        self.sq_norms.index_copy_(0, index, sq_norms)
        self.residuals.index_copy_(0, index, residuals)
        self._set_bounds()
        return self

    def gathered(self, factors, order, num_rows):
        """These factors made those of ``factors``' points (every one a column) in ``order`` (a
        permutation), with the first ``num_rows`` of them as rows: the columns gathered, no
        rounding (the same values as an ``update`` with the points in that order). Returns
        self."""
        self._column_buffer = kept_buffer(
            self._column_buffer, factors._column_buffer.shape, factors._column_buffer
        )
        torch.index_select(factors._column_buffer, 0, order, out=self._column_buffer)
        self.columns = aligned_rows(self._column_buffer, factors.columns.shape[1])
        self.sq_norms = self.residuals = None  # (update_rows is for factors in their points' order)
        self.radius, self.error = factors.radius, factors.error
        self._set_rows(num_rows)
        return self

    def _set_rows(self, num_rows):
        """The rows [-2 p~, hi, lo, 1, 1] of the first ``num_rows`` columns [p~, 1, 1, hi, lo]."""
        D = self.columns.shape[1] - 4
        # kept for the most rows asked for so far (a re-anchoring's rows vary from step to step),
        # padded (lower_bounds): finite values beyond the rows written, whose products are not read
        kept, needed = self._row_buffer, padded_rows(num_rows)
        if kept is None or kept.shape[1] != D + 4 or kept.device != self.columns.device or len(kept) < needed:
            grown = needed if kept is None else max(needed, len(kept))
            buffer = self.columns.new_zeros(grown, aligned_width(D + 4))
            self._row_buffer = aligned_rows(buffer, D + 4)
            self._row_buffer[:, D + 2 :] = 1
        self.rows = rows = self._row_buffer[:num_rows]
        torch.mul(self.columns[:num_rows, :D], -2, out=rows[:, :D])  # exact
        rows[:, D : D + 2] = self.columns[:num_rows, D + 2 :]

    def _set_bounds(self):
        """``radius`` and ``error`` from the columns' largest terms."""
        D = self.columns.shape[1] - 4
        eps = 2.0**-24
        # float32 sums of k terms err by at most gamma(k) times the sum of their magnitudes
        gamma = lambda k: k * eps / (1 - k * eps)  # noqa: E731
        # (the norms' and residuals' own float32 rounding: relative, within gamma(D) + 2^-22)
        if len(self.sq_norms):
            largest, residual = torch.stack([self.sq_norms.max(), self.residuals.max()]).tolist()
        else:
            largest, residual = 0.0, 0.0
        largest *= 1 + 2 * gamma(D) + 2.0**-21
        self.radius = 2 * residual * (1 + 2 * gamma(D) + 2.0**-21)
        self.error = (
            # the float32 sums of D + 4 exact products, whose magnitudes add up to <= 4.02 largest
            4.02 * gamma(D + 4) * largest
            # each norm as high + low (2^-16 relative) and as computed in float32
            + 2 * (2.0**-16 + gamma(D) + 2.0**-21) * largest
            # the float32 arithmetic on an entry (lower_bounds), and values flushed to zero
            + 2.0**-18 * largest
            + 2.0**-100
        )

    def tail(self, start):
        """The factors of the points from ``start`` on (every point a row: ``update`` with
        num_rows = n), as views of these: the same radius and error, which hold for any subset
        of the points."""
        tail = Bfloat16Factors()
        tail._row_buffer, tail.rows, tail.columns = (
            self._row_buffer[start:],
            self.rows[start:],
            self.columns[start:],
        )
        tail.radius, tail.error = self.radius, self.error
        return tail

    def bounds(self, near):
        """(scale, shift, width): ``scale * entry - shift`` is a lower bound of the squared
        distance of the float32 points, tightest near the squared distance ``near``, and adding
        ``width`` gives an upper bound for every entry whose lower bound is below ``near``.
        From ||p - q|| within radius of sqrt(s), s = ||p~ - q~||^2, and (sqrt(s) -+ radius)^2
        within s (1 -+ c) + radius^2 (1 -+ 1 / c) for any c > 0 (2 radius sqrt(s) <= c s +
        radius^2 / c), c = radius / sqrt(near): equality at s = near."""
        R, e, u = self.radius, self.error, self.relative
        c = 0.0 if R == 0 else min(R / math.sqrt(near), 0.5) if near > 0 else 0.5
        over_c = R * R / c if c else 0.0  # radius^2 / c (0 for points exact in bfloat16)
        # s >= (1 - u) entry - e (entry >= 0; below 0 the bound is negative: still one)
        scale = (1 - c) * (1 - u)
        shift = (1 - c) * e + over_c - R * R
        # s <= (1 + u) entry + e, and an entry's lower bound below near: entry <= (near + shift) / scale
        highest = max(near + shift, 0.0) / scale
        upper = (1 + c) * ((1 + u) * highest + e) + over_c + R * R
        width = upper - (scale * highest - shift) + scale * e * (1 + u)  # + negative entries' room
        return scale, shift, width

    def lower_bounds(self, row_start, row_stop, column_start, scale, shift):
        """The lower bounds (``bounds``) of the squared distances of rows row_start:row_stop
        against the columns from ``column_start``, in float32: one bfloat16 product, scaled and
        shifted in float32. The rows are padded (padded_rows) but when they are every point at
        once (the search of all pairs), whose shape stays that of the run."""
        num_rows = row_stop - row_start
        # (every point a row at once, the search of all pairs: one shape for the whole run)
        whole = num_rows == len(self.columns)
        padded = num_rows if whole else min(padded_rows(num_rows), len(self._row_buffer) - row_start)
        rows = self._row_buffer[row_start : row_start + padded]
        product = torch.mm(rows, self.columns[column_start:].T)[:num_rows]
        # in float32 first: an operation on bfloat16 and float32 tensors together takes a slow
        # element-by-element path on CPU (20 times slower than the three passes)
        return product.float().mul_(scale).sub_(shift)

    def upper_lower_bounds(self, scale, shift, step):
        """lower_bounds(0, n, 0, scale, shift) with every point a row (the search of all
        pairs), above the diagonal, and +inf on and below it (entries of no pair i < j): each
        block of ``step`` rows multiplied by the columns from its first row on only, as
        upper_sq_distances does in float32, so that the products cover about the upper
        triangle. Each entry is one bfloat16 product of the same row and column, whose bounds
        hold whatever the order of its sums (the same values bit for bit where oneDNN sums a
        block's entries as the square's, as it did in the shapes measured here); +inf stays
        +inf when scaled (scale > 0). Measured on 2 CPU cores (AVX-512 with BF16, torch 2.13,
        2 threads), 1 056 points of 512 coordinates, with the scaling: 4 blocks 2.8 ms, one
        product of the square 4.3 ms (docs/performance-log.md).
        The output is kept between calls and written in place (a fresh n x n tensor, 4.4 MB at
        1 056 points, cost 1 000 page faults, about 1 ms, whenever the C allocator took it from
        the system): a view of it is not to be kept across calls."""
        n = len(self.columns)
        # an ordinary tensor also under torch.inference_mode(): later calls write it in place
        with torch.inference_mode(False):
            square = self._square = kept_buffer(self._square, (n, n), self.columns, torch.float32)
        for start in range(0, n, step):
            stop = min(start + step, n)
            block = square[start:stop, start:]
            block.copy_(torch.mm(self._row_buffer[start:stop], self.columns[start:].T))
            mask_earlier_columns(square[start:stop], start)
        return square.mul_(scale).sub_(shift)


def padded_step(step, n, chunk_entries):
    """Rows per block of a search with bfloat16 products: ``step`` rounded to a size that
    padded_rows keeps (so lower_bounds pads only the last block), up if that keeps the blocks
    within ``chunk_entries`` entries against ``n`` columns, else down."""
    up = padded_rows(step)
    if up * n <= chunk_entries:
        return up
    return step // row_granularity(step) * row_granularity(step)


def block_rows(n, chunk_entries, min_blocks=8):
    """Rows per block of a search of n points, each row against the later ones: at most
    ``chunk_entries`` entries, and at least ``min_blocks`` blocks, so the blocks cover about
    the upper triangle (with 8, n^2 / 2 entries plus one eighth of n^2 / 2) rather than the
    whole n x n square."""
    return max(1, min(chunk_entries // max(1, n), -(-n // min_blocks)))


def row_blocks(points, num_rows, chunk_entries, factors=None, near=0.0):
    """The squared distances of the first ``num_rows`` points to the later points, by matrix
    products in blocks of rows: yields (start, sq, width), sq[r, c] for points start + r and
    start + c (entries with c <= r are not pairs of a row with a later point): their squared
    distance is within [sq - slack, sq + width + slack], slack = squared_distance_slack(points).

    Without ``factors`` the products are float32 and width is 0. ``factors``: the points'
    Bfloat16Factors (updated for these points and rows; ``points`` may then be None), for
    products several times faster on CPUs with bfloat16 instructions (bfloat16_products_pay);
    sq is then a lower bound, tightest near the squared distance ``near``, and width (about
    4 sqrt(near) radius) holds for the entries below ``near``."""
    if factors is not None:
        # bfloat16 products cost less against the work around each block: at least 4 blocks
        # (measured at n = 800: 4 blocks 0.88 ms, 8 blocks 1.02 ms, 16 blocks 1.49 ms)
        n = len(factors.columns)
        step = padded_step(block_rows(n, chunk_entries, min_blocks=4), n, chunk_entries)
        scale, shift, width = factors.bounds(near)
        for start in range(0, num_rows, step):
            yield start, factors.lower_bounds(start, min(start + step, num_rows), start, scale, shift), width
        return
    step = block_rows(len(points), chunk_entries)
    sq_norms = torch.linalg.vector_norm(points, dim=1).square()
    for start in range(0, num_rows, step):
        stop = min(start + step, num_rows)
        rows, row_sq_norms = points[start:stop], sq_norms[start:stop]
        yield start, sq_distance_block(rows, row_sq_norms, points[start:], sq_norms[start:]), 0.0


def screens_tiles(device):
    """Whether entries_below screens tiles on ``device``: on a CPU, where nonzero scans a mask
    on one thread; not elsewhere (a GPU), where nonzero is one parallel kernel and each of the
    screening's dozen operations a kernel launch."""
    return device.type == "cpu"


def entries_below(sq, threshold, tile=64):
    """The (row, col) indices of the entries of the 2D ``sq`` below ``threshold``, as
    ``(sq < threshold).nonzero()`` gives them (row-major). On a CPU nonzero scans a mask on one
    thread (about 2 ms for 5 M entries, at 0.4 ns an entry), so the entries are first screened
    in tiles of ``tile`` consecutive entries (row-major, across rows) by their minimum (one
    parallel reduction), and when at most half the entries are in tiles that may hold one (their
    minimum tells, or is NaN), only those tiles are scanned (measured on 2 CPU cores: 2.9 ms ->
    0.47 ms for 4 M entries of which 0.05 % below, 78 -> 54 us for the embeddings' 256 x 1 056
    block late in training; the same time when most tiles must be scanned). Elsewhere
    (``screens_tiles``) nonzero scans the whole mask."""
    n = sq.numel()
    if n < 8 * tile or not screens_tiles(sq.device):
        return (sq < threshold).nonzero().unbind(1)
    flat = sq.reshape(-1)
    whole = n - n % tile
    tiles = flat[:whole].view(-1, tile)
    hit = (~(tiles.amin(dim=1) >= threshold)).nonzero().squeeze(1)
    if 2 * len(hit) * tile > n:
        return (sq < threshold).nonzero().unbind(1)
    # tiles in ascending order, entries ascending within each: the row-major order of nonzero
    within, offset = (tiles[hit] < threshold).nonzero().unbind(1)
    index = hit[within].mul_(tile).add_(offset)
    if whole < n:  # the last entries, fewer than a tile
        index = torch.cat([index, (flat[whole:] < threshold).nonzero().squeeze(1).add_(whole)])
    columns = sq.shape[1]
    return index.div(columns, rounding_mode="floor"), index.remainder(columns)


def sq_distance_block(rows, row_sq_norms, columns, column_sq_norms):
    """||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b of each of ``rows`` against each of ``columns``,
    given their squared norms: one matrix product with the norms added to it (the expression
    whose rounding rounding_slack bounds; no augmented copies of the points)."""
    sq = torch.addmm(column_sq_norms.unsqueeze(0), rows, columns.T, alpha=-2)
    return sq.add_(row_sq_norms.unsqueeze(1))


@functools.lru_cache(maxsize=8)
def earlier_entries(rows, dtype, device):
    """(rows, rows) of ``dtype``: +inf on and below the diagonal, 0 above it (mask_earlier_columns
    adds it). Kept per shape: the same few blocks come at every step (on a CPU blocks of a few
    hundred rows; on a GPU the search of all pairs is one block, up to about 1 450 rows, 8 MB)."""
    ones = torch.ones(rows, rows, dtype=torch.bool, device=device)
    return torch.zeros(rows, rows, dtype=dtype, device=device).masked_fill_(ones.tril(), math.inf)


def mask_earlier_columns(sq, start):
    """Sets to +inf the entries of a block of a search that are no pair of its row with a later
    point: row r is the point start + r, column c the point c, and the entries with c <= start + r
    are the point itself (distance 0) and pairs already found from the earlier row. Left finite,
    they would be found below every threshold and dropped one by one; +inf, the screening of
    entries_below skips them. The square of columns start:start + rows by adding earlier_entries
    (4 times as fast as a masked_fill_ on a CPU): an entry plus 0 is itself (-0.0 becomes 0.0, the
    same in any comparison), plus +inf is +inf (or NaN, which is below no threshold either)."""
    rows = len(sq)
    sq[:, :start] = math.inf
    sq[:, start : start + rows].add_(earlier_entries(rows, sq.dtype, sq.device))


def upper_sq_distances(points, sq_norms, step):
    """sq_distance_block(points, sq_norms, points, sq_norms) above the diagonal, and +inf on and
    below it (entries of no pair i < j; mask_earlier_columns): each block of ``step`` rows multiplied
    by the points from its first row on only, so that the products cover about the upper
    triangle (with 8 blocks, n^2 / 2 entries plus an eighth of that), not the whole n x n
    square. The same expression, whose rounding rounding_slack bounds whatever the order of a
    product's sums (the same values bit for bit where the matrix library sums a block's entries
    as it sums the square's, as MKL did in the shapes measured here). Measured on 2 CPU cores
    (AVX2, torch 2.14.1, 2 threads) with the screening of entries_below after it: 1 056 points
    of 512 coordinates 6.9 ms against 9.8 ms in one product, 1 448 points 12.9 ms against
    20.7 ms (docs/performance-log.md)."""
    n = len(points)
    sq = points.new_empty(n, n)
    for start in range(0, n, step):
        stop = min(start + step, n)
        block = sq[start:stop, start:]
        torch.addmm(sq_norms[start:].unsqueeze(0), points[start:stop], points[start:].T, alpha=-2, out=block)
        block.add_(sq_norms[start:stop].unsqueeze(1))
        mask_earlier_columns(sq[start:stop], start)
    return sq

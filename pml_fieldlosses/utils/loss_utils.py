import math

import torch


def grouped_max(values, groups, num_groups):
    """max(0, the largest of each group's rows of ``values``) (detached), (num_groups, ...)
    from values (N, ...) and the group (N,) of each row: 0 for an empty group, and for a
    group whose values are all -inf."""
    index = groups.view((-1,) + (1,) * (values.ndim - 1)).expand_as(values)
    shape = (num_groups,) + values.shape[1:]
    return values.new_zeros(shape).scatter_reduce(0, index, values.detach(), "amax", include_self=True)


def grouped_exps(values, groups, num_groups):
    """grouped_exp_sums, also returning each row's exponential: (shift, exps, sums) with
    exps = exp(values - shift[groups]), shaped like values (for a backward that reuses them)."""
    shift = grouped_max(values, groups, num_groups)
    exps = torch.exp(values - shift.index_select(0, groups))
    return shift, exps, values.new_zeros(shift.shape).index_add(0, groups, exps)


def grouped_exp_sums(values, groups, num_groups):
    """Sums of exp(values) over groups of rows, with a stabilising shift.

    values: (N, ...) float tensor; groups: (N,) integers in [0, num_groups).
    Returns (shift, sums), both (num_groups, ...): shift = max(0, the group's
    largest value), detached, and sums = sum of exp(values - shift) over the
    group's rows, so the group's sum of exp(values) is exp(shift) * sums.
    Because the shift is >= 0 and attained when > 0, exp(-shift) + sums >= 1.
    Empty groups get shift 0 and sums 0.
    """
    shift, _, sums = grouped_exps(values, groups, num_groups)
    return shift, sums


def log1p_sum_exp(values, groups, num_groups):
    """log(1 + sum of exp(values) over each group of rows), computed stably.

    Like PML's logsumexp(add_one=True), for ragged groups. An empty group
    gives exactly 0 with zero gradient.
    """
    shift, sums = grouped_exp_sums(values, groups, num_groups)
    return shift + torch.log(torch.exp(-shift) + sums)


def upcast_half(x):
    """float16/bfloat16 -> float32; anything else (including None) unchanged.

    The gradient goes back in the input's dtype as torch's own cast sends it: a
    float32 gradient beyond float16's range (65504) arrives as inf, so that a
    GradScaler sees the overflow, skips the step and lowers its scale. Clamping
    it to the largest finite value instead would hide the overflow from the
    scaler and clip the gradient without a trace."""
    if x is not None and x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def index_counts(index, size):
    """torch.bincount(index, minlength=size) for an ``index`` whose values are below ``size``
    (int64 counts), by index_add_: a GPU's bincount reads the largest value on the host first,
    which waits for the GPU."""
    ones = torch.ones_like(index, dtype=torch.int64)
    return torch.zeros(size, dtype=torch.int64, device=index.device).index_add_(0, index, ones)


def compact_labels(labels):
    """Sorted distinct labels, each sample's index into them, and the index of
    the first sample of each distinct label."""
    classes, inverse = torch.unique(labels, sorted=True, return_inverse=True)
    positions = torch.arange(len(labels), device=labels.device)
    first = torch.full_like(classes, len(labels)).scatter_reduce(
        0, inverse, positions, "amin", include_self=True
    )
    return classes, inverse, first


def scale_rows_for_normalize(x):
    """x with each row whose sum of squares could overflow (largest |entry|
    >= 2**(max_exponent / 2 - 10): ~1.8e16 in float32, ~1e151 in float64)
    divided by a power of two that brings its largest |entry| into [0.5, 1);
    other rows unchanged, bit for bit (None stays None).

    For losses that L2-normalise their inputs: ||x|| overflows to inf for
    rows as large as ~1e19 in float32, and x / ||x|| becomes a zero vector
    with a zero gradient. Dividing by a power of two changes only the
    exponents, so the normalised row is the one x / ||x|| would give in exact
    arithmetic; the factor is a constant (no gradient of its own), which is
    exact because x / ||x|| does not depend on the row's scale.
    """
    if x is None:
        return None
    return x * _row_scale(x)


def unit_rows(x, eps, out=None):
    """x / max(||x||, eps) over the last dimension (torch's normalize, bit for bit) and the
    norms (keepdim); the unit rows written into ``out`` if given."""
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.div(x, norms.clamp_min(eps), out=out), norms


def unit_rows_backward(grad, unit, norms, eps):
    """The gradient w.r.t. x of unit_rows(x, eps)[0] = x / max(||x||, eps), from the unit rows
    and the norms: (grad - unit (unit . grad)) / ||x|| where ||x|| >= eps (the component along
    the row removed), grad / eps where smaller (the clamped norm is a constant there). The same
    gradient as autograd through the plain ops (which takes about eight passes over x for it)."""
    along = torch.linalg.vecdot(unit, grad).unsqueeze(-1).masked_fill_(norms < eps, 0)
    # the same operations in the same order as (grad - unit * along) / clamped norms, in one
    # temporary of x's size instead of three
    result = unit * along
    return torch.sub(grad, result, out=result).div_(norms.clamp_min(eps))


class UnitRows(torch.autograd.Function):
    """unit_rows(x, eps) with unit_rows_backward as its backward; the norms are not
    differentiated (the head only checks them). No double backward."""

    @staticmethod
    def forward(ctx, x, eps):
        unit, norms = unit_rows(x, eps)
        ctx.save_for_backward(unit, norms)
        ctx.eps = eps
        ctx.mark_non_differentiable(norms)
        return unit, norms

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad, _):
        unit, norms = ctx.saved_tensors
        return unit_rows_backward(grad, unit, norms, ctx.eps), None


class NormalizedRows(torch.autograd.Function):
    """torch's normalize (p = 2, over the rows of a 2D ``x``, ``eps``) of
    scale_rows_for_normalize(x) (``scaled``, the default) or of x itself, as autograd's chain
    of those ops computes it: the same values and gradients, bit for bit (a zero entry of the
    gradient may differ in sign). Autograd's chain makes up to nine (C, D) temporaries (the
    |x| of the row scaling, the scaled rows, the division and their backward); here the
    forward makes one and the backward two, with the same operations in the same order, hence
    the same rounding. A second derivative (create_graph=True) differentiates autograd's
    chain."""

    @staticmethod
    def forward(ctx, x, eps, scaled=True):
        scale = _row_scale(x) if scaled else None
        norm_of = x * scale if scaled else x
        norm = norm_of.norm(2, 1, True)
        clamped = norm.clamp_min(eps)
        normalized = norm_of.div_(clamped) if scaled else x / clamped
        ctx.save_for_backward(x, scale, normalized, norm, clamped)
        ctx.eps = eps
        return normalized

    @staticmethod
    def backward(ctx, grad):
        x, scale, normalized, norm, clamped = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: a graph of the first derivative is wanted
            with torch.enable_grad():
                rows = x * scale if scale is not None else x
                chain = torch.nn.functional.normalize(rows, p=2, dim=1, eps=ctx.eps)
            return torch.autograd.grad(chain, x, grad, create_graph=True)[0], None, None
        return normalized_rows_backward(grad, x, scale, normalized, norm, clamped, ctx.eps), None, None


def normalized_rows_backward(grad, x, scale, normalized, norm, clamped, eps):
    """NormalizedRows' first derivative, from its saved tensors (``scale`` None: not scaled)."""
    # autograd's steps: the division's gradient w.r.t. its denominator,
    # -grad * ((y / n) / n) summed over the row (y = x * scale, y / n = normalized) ...
    temp = normalized / clamped
    temp.mul_(grad)
    grad_norm = torch.where(norm >= eps, -temp.sum(dim=1, keepdim=True), 0.0)
    # ... the norm's, grad_norm * (y / ||y||), 0 on zero rows (y is 0 there: dividing
    # by 1 gives the 0 the masked NaN becomes) ...
    if scale is not None:
        torch.mul(x, scale, out=temp)
    else:
        temp.copy_(x)
    temp.div_(norm.masked_fill(norm == 0, 1.0)).mul_(grad_norm)
    # ... added to the division's gradient w.r.t. its numerator, grad / n, times the scale
    result = (grad / clamped).add_(temp)
    return result.mul_(scale) if scale is not None else result


class GatheredNormalizedRows(torch.autograd.Function):
    """torch.cat([head, NormalizedRows(x[rows], eps, False)]) for distinct ``rows``, from
    ``normalized`` and ``norm``, all of x's rows normalised and their norms (unit_rows, without
    gradient): the same values and gradients w.r.t. head and x, bit for bit. The forward copies
    head and the gathered normalised rows into one output (instead of gathering and
    normalising x's rows, then concatenating), and the backward computes x's gradient
    ``block_rows`` rows at a time, writing each row's into x's shape directly (autograd's gather
    backward adds them into zeros: for distinct rows the same values). At tens of thousands of
    proxies every (rows, D) temporary is fresh memory from the system at every step (above the
    C allocator's reuse threshold) and its page faults cost more than the arithmetic; the blocks'
    temporaries stay small and are reused. A block is never a single row unless ``rows`` is
    (a row's sum then stays a reduction over one row among others, in the same order). First
    derivatives only."""

    @staticmethod
    def forward(ctx, head, x, rows, normalized, norm, eps, block_rows):
        B = len(head)
        out = normalized.new_empty(B + len(rows), x.shape[1])
        out[:B] = head
        torch.index_select(normalized, 0, rows, out=out[B:])
        ctx.save_for_backward(x, rows, out, norm.index_select(0, rows))
        ctx.eps, ctx.head_rows, ctx.block_rows = eps, B, block_rows
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, rows, out, norm = ctx.saved_tensors
        B = ctx.head_rows
        head_grad = grad[:B] if ctx.needs_input_grad[0] else None
        if not ctx.needs_input_grad[1]:
            return head_grad, None, None, None, None, None, None
        # distinct rows as many as x's: every row of x is written
        x_grad = torch.empty_like(x) if len(rows) == len(x) else x.new_zeros(x.shape)
        clamped = norm.clamp_min(ctx.eps)
        for start, stop in row_blocks(len(rows), ctx.block_rows):
            block = rows[start:stop]
            block_grad = normalized_rows_backward(
                grad[B + start : B + stop],
                x.index_select(0, block),
                None,
                out[B + start : B + stop],
                norm[start:stop],
                clamped[start:stop],
                ctx.eps,
            )
            x_grad.index_copy_(0, block, block_grad)
        return head_grad, x_grad, None, None, None, None, None


def row_blocks(num_rows, block_rows):
    """(start, stop) of consecutive blocks of ``block_rows`` rows (at least 2) covering
    ``num_rows``, the last one merged into the one before if it would be a single row."""
    step = max(2, block_rows)
    starts = list(range(0, num_rows, step))
    if len(starts) > 1 and num_rows - starts[-1] == 1:
        starts.pop()
    return list(zip(starts, starts[1:] + [num_rows]))


def _row_scale(x):
    """The factor scale_rows_for_normalize multiplies x by (a power of two per row, 1 on rows
    below its threshold), from the row's largest and smallest entry: its largest |entry|
    without an |x| temporary (torch's aminmax is slower on CPU than the two reductions)."""
    max_exponent = math.frexp(torch.finfo(x.dtype).max)[1]
    threshold = 2.0 ** (max_exponent // 2 - 10)
    x = x.detach()
    largest = torch.maximum(x.amax(dim=1, keepdim=True), -x.amin(dim=1, keepdim=True))
    # no branch on the values (no device synchronisation): other rows are multiplied by 1. The
    # exponents (small integers, exact in x's dtype) are masked in x's dtype: torch.compile's
    # inductor fails to compile (CPU) a masked int32 frexp exponent next to float64 values
    exponent = torch.frexp(largest).exponent.to(x.dtype)
    exponent = exponent.masked_fill(largest < threshold, 0.0)
    # (a Python base: a tensor made from a Python number is copied to a GPU, which waits for it)
    return torch.pow(2.0, -exponent)

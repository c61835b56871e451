import torch


def log1p_sum_exp(values, groups, num_groups):
    """log(1 + sum of exp(values) over each group), computed stably.

    values: float tensor; groups: integer tensor of the same shape with entries
    in [0, num_groups). Returns a tensor of size num_groups; an empty group
    gives exactly 0 with zero gradient. This is PML's logsumexp(add_one=True)
    for ragged groups: the max shift includes the "1" (exponent 0), so it is
    finite and the sum inside the log is >= 1.
    """
    values, groups = values.reshape(-1), groups.reshape(-1)
    shift = values.new_zeros(num_groups)
    shift = shift.scatter_reduce(0, groups, values.detach(), "amax", include_self=True)
    total = torch.exp(-shift).index_add(0, groups, torch.exp(values - shift[groups]))
    return shift + torch.log(total)


def upcast_half(x):
    """float16/bfloat16 -> float32; anything else (including None) unchanged."""
    if x is not None and x.dtype in (torch.float16, torch.bfloat16):
        return x.float()
    return x


def compact_labels(labels):
    """Sorted distinct labels, each sample's index into them, and the index of
    the first sample of each distinct label."""
    classes, inverse = torch.unique(labels, sorted=True, return_inverse=True)
    positions = torch.arange(len(labels), device=labels.device)
    first = torch.full_like(classes, len(labels)).scatter_reduce(
        0, inverse, positions, "amin", include_self=True
    )
    return classes, inverse, first

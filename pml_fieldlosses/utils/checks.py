"""Input checks shared by the losses: clear errors instead of NaN or torch internals."""

import math
import numbers

import torch

# The smallest dtype our losses compute in (float16/bfloat16 inputs are upcast
# to it): bounds on hyperparameters are stated for it.
COMPUTE_DTYPE_MAX = torch.finfo(torch.float32).max


def check_embeddings(embeddings, embedding_size=None, name="embeddings", finite=True):
    """A non-empty 2D floating point tensor (of embedding_size columns if given) with no NaN
    or inf values; finite=False skips that last scan, for a caller that knows the values
    finite (e.g. a RelationalEmbedder's output, which the head has already checked)."""
    if not torch.is_tensor(embeddings):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(embeddings).__name__}")
    if embeddings.ndim != 2:
        raise ValueError(
            f"{name} must be 2D of shape (batch_size, embedding_size), got shape {tuple(embeddings.shape)}"
        )
    if not embeddings.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got dtype {embeddings.dtype}")
    if embeddings.shape[0] == 0:
        raise ValueError(f"{name} is empty (batch size 0): the loss needs at least one sample")
    if embeddings.shape[1] == 0:
        raise ValueError(f"{name} have dimension 0: the loss needs at least one embedding coordinate")
    if embedding_size is not None and embeddings.shape[1] != embedding_size:
        raise ValueError(
            f"{name} have dimension {embeddings.shape[1]}, but the loss was built with embedding_size={embedding_size}"
        )
    if finite:
        check_finite(embeddings, name)


def check_finite(values, name):
    """A non-empty floating point tensor with no NaN or inf values. Its smallest and largest
    values are finite exactly when every value is (aminmax propagates NaN): one reduction, with
    no temporary, over ten times faster than isfinite(...).all() on a CPU."""
    if not torch.isfinite(torch.stack(torch.aminmax(values.detach()))).all():
        raise ValueError(f"{name} contain NaN or inf values")


def check_same_kind(ref_emb, embeddings, name="ref_emb", emb_name="embeddings"):
    """ref_emb must have the dtype and device of embeddings (torch would fail
    deep inside a matmul otherwise)."""
    if ref_emb.dtype != embeddings.dtype:
        raise TypeError(
            f"{name} has dtype {ref_emb.dtype} but {emb_name} has dtype {embeddings.dtype}; "
            f"cast one of them (e.g. {name}.to({emb_name}.dtype))"
        )
    if ref_emb.device != embeddings.device:
        raise ValueError(f"{name} is on {ref_emb.device} but {emb_name} is on {embeddings.device}")


# unsigned integer dtypes wider than uint8 (torch 2.3 and later), which torch's min/max reject
_WIDE_UNSIGNED = tuple(
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
)


def check_labels(labels, embeddings, num_classes=None, name="labels", emb_name="embeddings", owner=None):
    """Class-index labels for ``embeddings``: an integer tensor of one entry per row, each in
    [0, num_classes) (num_classes None: >= 0). ``owner`` names the loss whose num_classes it
    is, when the caller wraps several (e.g. "branch_losses[2] (ProxyAnchorLoss)")."""
    if labels is None:
        raise ValueError(f"{name} are required for this loss function")
    if not torch.is_tensor(labels):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(labels).__name__}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (class indices), got dtype {labels.dtype}")
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1D of shape (batch_size,), got shape {tuple(labels.shape)}")
    if labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"{name} has {labels.shape[0]} entries but {emb_name} has {embeddings.shape[0]} rows"
        )
    if labels.numel() == 0:
        return
    dtype = labels.dtype
    if dtype in _WIDE_UNSIGNED:  # (torch reduces none of them: as int64, what the losses use)
        labels = labels.to(torch.int64)
    # both ends in one read (on a GPU each value read on the host waits for it)
    low, high = torch.stack(torch.aminmax(labels)).tolist()
    if low < 0:
        if dtype in _WIDE_UNSIGNED:  # a uint64 value from 2**63 on, wrapped
            raise ValueError(f"{name} must be class indices below 2**63, got a larger {dtype} value")
        raise ValueError(f"{name} must be >= 0, got min {low}")
    if num_classes is not None and high >= num_classes:
        of = "" if owner is None else f" of {owner}"
        raise ValueError(f"{name} must be in [0, num_classes={num_classes}){of}, got max {high}")


def as_index_labels(labels, embeddings):
    """Integer labels of any integer dtype (int8/16/32, uint8, ...) as int64 on
    the embeddings' device, the form torch's indexing, scatter and gather need.
    Labels made under torch.inference_mode() and used outside it are copied: gather
    and scatter save their index for the backward, which an inference tensor cannot be.
    Call after check_labels; None stays None."""
    if labels is None:
        return None
    labels = labels.to(device=embeddings.device, dtype=torch.long)
    if labels.is_inference() and not torch.is_inference_mode_enabled():
        labels = labels.clone()
    return labels


def ref_not_supported(loss, embeddings, labels, ref_emb, ref_labels):
    if ref_emb is not embeddings or ref_labels is not labels:
        raise ValueError(
            f"{type(loss).__name__} does not support ref_emb/ref_labels: its second "
            "operand is the learnable per-class parameter, not a reference set"
        )


def check_finite_number(name, value, low=None, high=None, low_open=False, high_open=False):
    """value must be a real, finite number (a Python or numpy number, not bool,
    not a tensor) in [low, high] (an end is excluded when *_open; None = no
    bound). Returns value as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    requirements = []
    if low is not None:
        requirements.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        requirements.append(f"{'<' if high_open else '<='} {high:g}")
    bad = not math.isfinite(value)
    bad = bad or (low is not None and (value < low or (low_open and value == low)))
    bad = bad or (high is not None and (value > high or (high_open and value == high)))
    if bad:
        raise ValueError(f"{name} must be {' and '.join(requirements + ['finite'])}, got {value:g}")
    return value


def check_positive(name, value):
    """Finite and > 0."""
    check_finite_number(name, value, low=0, low_open=True)


def check_non_negative(name, value):
    """Finite and >= 0."""
    check_finite_number(name, value, low=0)


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


# check_fits_float32 keeps this factor of float32's range free for the sums
# over samples, classes and pairs that follow the bounded intermediate
HEADROOM = 1e8


def check_fits_float32(description, bound):
    """The loss computes an intermediate whose largest possible magnitude,
    given its hyperparameters, is `bound` (a Python float, or a callable
    returning one, so that an OverflowError of math.pow or ** is caught here).
    Refuse when bound * HEADROOM exceeds float32's range, the smallest dtype
    the losses compute in (float16/bfloat16 inputs are upcast to it)."""
    try:
        bound = float(bound() if callable(bound) else bound)
    except (OverflowError, ZeroDivisionError):
        bound = math.inf
    if not bound * HEADROOM <= COMPUTE_DTYPE_MAX:
        raise ValueError(
            f"{description} can reach {bound:g}, too close to the float32 range ({COMPUTE_DTYPE_MAX:g}) "
            f"the loss computes in (limit {COMPUTE_DTYPE_MAX / HEADROOM:g}): choose less extreme hyperparameters"
        )

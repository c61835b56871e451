import os
import zlib

import torch

from pml_fieldlosses import losses

from . import naive

# float64 all the way: 1e-12 relative (atol is relative to the largest
# expected entry, see assert_close); float16 as PML's own tests (rtol 1e-2).
TOLERANCES = {
    torch.float64: dict(rtol=1e-12, atol=1e-15),
    torch.float32: dict(rtol=1e-4, atol=1e-6),
    torch.float16: dict(rtol=1e-2, atol=1e-3),
    torch.bfloat16: dict(rtol=5e-2, atol=1e-2),
}


def dtypes_from_env(variable="TEST_DTYPES", default="float32,float64"):
    """Dtypes named in $TEST_DTYPES (comma-separated, as PML's tests read it)."""
    dtypes = []
    for name in os.environ.get(variable, default).split(","):
        dtype = getattr(torch, name.strip(), None)
        if not isinstance(dtype, torch.dtype) or dtype not in TOLERANCES:
            raise ValueError(
                f"{variable}: unknown dtype {name.strip()!r}; use some of {sorted(map(str, TOLERANCES))}"
            )
        dtypes.append(dtype)
    return dtypes


# The exactness and behaviour tests run in these dtypes on this device:
# TEST_DTYPES=float16,float32,float64 TEST_DEVICE=cuda runs them on a GPU.
DTYPES = dtypes_from_env()
DEVICE = torch.device(os.environ.get("TEST_DEVICE", "cpu"))
# float16/bfloat16 inputs are computed in float32 by our losses (CheckedForwardMixin)
LOSS_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}

# label patterns over C = 9 classes; each is a list of labels for one batch
LABEL_PATTERNS = {
    "random": None,  # filled with a random draw
    "absent_classes": [0, 0, 2, 2, 2, 5, 5, 1],  # 3, 4, 6, 7, 8 absent
    "singleton_class": [0, 0, 1, 1, 4, 3, 3, 3],  # class 4 has one sample
    "single_class": [6, 6, 6, 6, 6],
    "single_sample": [3],
}
NUM_CLASSES, EMBEDDING_SIZE = 9, 6


def generator_for(*key):
    """A generator seeded by the test case, so each case has its own fixed data."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def make_labels(pattern, generator):
    labels = LABEL_PATTERNS[pattern]
    if labels is None:
        labels = torch.randint(0, NUM_CLASSES, (12,), generator=generator).tolist()
    return labels


def make_embeddings(batch_size, dtype, generator, normalized=False, scale=3.0, device="cpu"):
    x = torch.randn(batch_size, EMBEDDING_SIZE, generator=generator, dtype=torch.float64) * scale
    if normalized:
        x = torch.nn.functional.normalize(x, dim=1)
    return x.to(device=device, dtype=dtype)


def assert_close(actual, expected, dtype):
    """Compare in float64; atol is relative to the largest expected entry."""
    expected = expected.detach().cpu().to(torch.float64)
    actual = actual.detach().cpu().to(torch.float64)
    tol = TOLERANCES[dtype]
    scale = max(expected.abs().max().item(), 1e-30)
    torch.testing.assert_close(actual, expected, rtol=tol["rtol"], atol=tol["atol"] + tol["rtol"] * scale)


# Each case: (name, builder of our loss, naive reference (x, labels, W) -> loss).
# Hyperparameters are chosen so that every term matters at the test scale.
MF_CASES = {
    "MeanFieldContrastive": (
        lambda **kw: losses.MeanFieldContrastiveLoss(
            NUM_CLASSES, EMBEDDING_SIZE, pos_margin=0.1, neg_margin=0.9, mf_reg_weight=0.5, **kw
        ),
        lambda x, y, W, weights=None: naive.mean_field_contrastive(x, y, W, 0.1, 0.9, 0.5, 2, weights),
    ),
    "MeanFieldContrastive_defaults": (
        lambda **kw: losses.MeanFieldContrastiveLoss(NUM_CLASSES, EMBEDDING_SIZE, **kw),
        lambda x, y, W, weights=None: naive.mean_field_contrastive(x, y, W, 0.02, 0.3, 0.0, 2, weights),
    ),
    "MeanFieldClassWiseMultiSimilarity": (
        lambda **kw: losses.MeanFieldClassWiseMultiSimilarityLoss(
            NUM_CLASSES,
            EMBEDDING_SIZE,
            alpha=2.0,
            beta=10.0,
            base=0.5,
            mf_reg_weight=0.3,
            mf_reg_power=3,
            **kw,
        ),
        lambda x, y, W, weights=None: naive.mean_field_class_wise_multi_similarity(
            x, y, W, 2.0, 10.0, 0.5, 0.3, 3, weights
        ),
    ),
    "MeanFieldClassWiseMultiSimilarity_defaults": (
        lambda **kw: losses.MeanFieldClassWiseMultiSimilarityLoss(NUM_CLASSES, EMBEDDING_SIZE, **kw),
        lambda x, y, W, weights=None: naive.mean_field_class_wise_multi_similarity(
            x, y, W, 0.01, 80, 0.8, 0.0, 2, weights
        ),
    ),
}

CWMS_CASES = {
    "ClassWiseMultiSimilarity": (
        lambda **kw: losses.ClassWiseMultiSimilarityLoss(alpha=2.0, beta=10.0, base=0.5, **kw),
        lambda x, y, **kw: naive.class_wise_multi_similarity(x, y, 2.0, 10.0, 0.5, **kw),
    ),
    "ClassWiseMultiSimilarity_defaults": (
        lambda **kw: losses.ClassWiseMultiSimilarityLoss(**kw),
        lambda x, y, **kw: naive.class_wise_multi_similarity(x, y, 0.01, 80, 0.8, **kw),
    ),
}


def gradients(loss, inputs):
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def assert_input_gradient_finite(x, loss_of):
    """The gradient ``x.grad`` left by a backward pass is finite; for float16 ``x``, where
    the loss computes in float32, it is the float32 gradient (finite) cast to float16 as
    torch casts, so inf where that gradient leaves float16's range (e.g. the 1/eps slope of
    normalising a zero row), which a GradScaler detects. ``loss_of(inputs)`` recomputes
    the loss on float32 inputs for that comparison."""
    if x.dtype != torch.float16:
        assert torch.isfinite(x.grad.float()).all(), "non-finite input gradient"
        return
    full = x.detach().float().requires_grad_()
    (expected,) = torch.autograd.grad(loss_of(full), [full])
    assert torch.isfinite(expected).all(), "non-finite float32 input gradient"
    assert torch.equal(x.grad, expected.half()), "the float16 gradient is not the float32 one cast"


def pair_set(pairs):
    """A (2, K) tensor of index pairs as a set of (i, j) tuples."""
    return set(map(tuple, pairs.T.tolist()))

"""Bad input gets a clear error naming the argument, never NaN or a torch internal error."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.losses import ProxyAnchorLoss

from pml_fieldlosses import losses
from pml_fieldlosses.app import catalog
from pml_fieldlosses.losses.declarations import DECLARATIONS
from pml_fieldlosses.models import RelationalEmbedder

from .helpers import DEVICE
from .loss_registry import ALL_LOSSES

C, D = 5, 4
LOSSES = {
    "MeanFieldContrastive": lambda: losses.MeanFieldContrastiveLoss(C, D),
    "ClassWiseMultiSimilarity": lambda: losses.ClassWiseMultiSimilarityLoss(),
    "MeanFieldClassWiseMultiSimilarity": lambda: losses.MeanFieldClassWiseMultiSimilarityLoss(C, D),
    "PotentialField": lambda: losses.PotentialFieldLoss(C, D),
    "ContrastivePotential": lambda: losses.ContrastivePotentialLoss(C, D),
}
NEEDS_NUM_CLASSES = {
    "MeanFieldContrastive",
    "MeanFieldClassWiseMultiSimilarity",
    "PotentialField",
    "ContrastivePotential",
}

x = torch.randn(3, D)
y = torch.tensor([0, 1, 1])
BAD_CALLS = {
    "labels_too_large": ((x, torch.tensor([0, 1, C])), ValueError, r"labels must be in \[0, num_classes=5\)"),
    "negative_labels": ((x, torch.tensor([0, -1, 1])), ValueError, "labels must be >= 0"),
    "float_labels": ((x, torch.tensor([0.0, 1.0, 1.0])), TypeError, "labels must be an integer tensor"),
    "bool_labels": ((x, torch.tensor([True, False, True])), TypeError, "labels must be an integer tensor"),
    "labels_2d": ((x, y.unsqueeze(1)), ValueError, "labels must be 1D"),
    "length_mismatch": (
        (x, torch.tensor([0, 1])),
        ValueError,
        "labels has 2 entries but embeddings has 3 rows",
    ),
    "missing_labels": ((x, None), ValueError, "labels are required"),
    "labels_not_tensor": ((x, [0, 1, 1]), TypeError, "labels must be a torch.Tensor"),
    "wrong_dim": ((torch.randn(3, D + 1), y), ValueError, "embedding_size=4"),
    "embeddings_1d": ((torch.randn(D), y), ValueError, "embeddings must be 2D"),
    "integer_embeddings": ((torch.ones(3, D, dtype=torch.long), y), TypeError, "floating point"),
    "nan": ((x.clone().index_fill_(0, torch.tensor([1]), float("nan")), y), ValueError, "NaN or inf"),
    "inf": ((x.clone().index_fill_(0, torch.tensor([2]), float("inf")), y), ValueError, "NaN or inf"),
    "empty_batch": ((torch.randn(0, D), torch.tensor([], dtype=torch.long)), ValueError, "empty"),
    "ref_labels_without_ref_emb": ((x, y, None, None, y), ValueError, "ref_labels was given without ref_emb"),
}


@pytest.mark.parametrize("bad", BAD_CALLS)
@pytest.mark.parametrize("loss_name", LOSSES)
def test_bad_calls_raise_clear_errors(loss_name, bad):
    args, error, message = BAD_CALLS[bad]
    if loss_name not in NEEDS_NUM_CLASSES and bad in ("labels_too_large", "wrong_dim"):
        pytest.skip("this loss has no num_classes / embedding_size")
    with pytest.raises(error, match=message):
        LOSSES[loss_name]()(*args)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "loss_name, dense",
    [
        (name, dense)
        for name in sorted(NEEDS_NUM_CLASSES)
        for dense in ([True, False] if "Potential" in name else [None])
    ],
)
def test_non_finite_learned_parameters_are_named(loss_name, dense, value):
    """A NaN or inf in a loss's own parameters (a diverged step, a bad checkpoint) is named,
    never a NaN loss, nor a finite one from the potential losses' searches (dense=False),
    which would not find the pairs of a NaN proxy."""
    loss_fn = LOSSES[loss_name]()
    if dense is not None:
        loss_fn.dense = dense
    (name, parameter), *_ = loss_fn.named_parameters()
    with torch.no_grad():
        parameter.view(-1)[3] = value
    with pytest.raises(ValueError, match=rf"{type(loss_fn).__name__}\.{name} contain NaN or inf"):
        loss_fn(x, y)


def test_bad_reference_set_for_class_wise_multi_similarity():
    loss_fn = losses.ClassWiseMultiSimilarityLoss()
    with pytest.raises(ValueError, match="ref_emb have dimension 5"):
        loss_fn(x, y, ref_emb=torch.randn(2, D + 1), ref_labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="ref_labels has 1 entries but ref_emb has 2 rows"):
        loss_fn(x, y, ref_emb=torch.randn(2, D), ref_labels=torch.tensor([0]))
    with pytest.raises(ValueError, match="ref_labels are required"):
        loss_fn(x, y, ref_emb=torch.randn(2, D))
    with pytest.raises(ValueError, match="ref_emb contain NaN"):
        loss_fn(x, y, ref_emb=torch.full((2, D), float("nan")), ref_labels=torch.tensor([0, 1]))


BAD_CONSTRUCTIONS = [
    (losses.MeanFieldContrastiveLoss, dict(num_classes=0, embedding_size=D), "num_classes"),
    (losses.MeanFieldContrastiveLoss, dict(num_classes=2.5, embedding_size=D), "num_classes"),
    (losses.MeanFieldContrastiveLoss, dict(num_classes=C, embedding_size=0), "embedding_size"),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, mf_reg_weight=-1),
        "mf_reg_weight",
    ),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, mf_reg_power=0.5),
        "mf_reg_power",
    ),
    (losses.MeanFieldClassWiseMultiSimilarityLoss, dict(num_classes=C, embedding_size=D, alpha=0), "alpha"),
    (losses.MeanFieldClassWiseMultiSimilarityLoss, dict(num_classes=C, embedding_size=D, beta=-2), "beta"),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, neg_margin=float("inf")),
        "neg_margin",
    ),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, pos_margin=float("nan")),
        "pos_margin",
    ),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, mf_reg_weight=float("inf")),
        "mf_reg_weight",
    ),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, mf_reg_power=float("nan")),
        "mf_reg_power",
    ),
    (
        losses.MeanFieldContrastiveLoss,
        dict(num_classes=C, embedding_size=D, neg_margin=1e3, mf_reg_weight=1, mf_reg_power=20),
        "mf_reg_power",
    ),
    (
        losses.MeanFieldClassWiseMultiSimilarityLoss,
        dict(num_classes=C, embedding_size=D, alpha=float("nan")),
        "alpha",
    ),
    (losses.MeanFieldClassWiseMultiSimilarityLoss, dict(num_classes=C, embedding_size=D, beta=1e40), "beta"),
    (
        losses.MeanFieldClassWiseMultiSimilarityLoss,
        dict(num_classes=C, embedding_size=D, alpha=1e-38),
        "alpha",
    ),
    (
        losses.MeanFieldClassWiseMultiSimilarityLoss,
        dict(num_classes=C, embedding_size=D, base=float("-inf")),
        "base",
    ),
    (losses.ClassWiseMultiSimilarityLoss, dict(alpha=float("inf")), "alpha"),
    (losses.ClassWiseMultiSimilarityLoss, dict(beta=float("nan")), "beta"),
    (losses.ClassWiseMultiSimilarityLoss, dict(base=float("nan")), "base"),
    (losses.ClassWiseMultiSimilarityLoss, dict(beta=80, base=1e30), "beta"),
]


@pytest.mark.parametrize("loss_class, kwargs, name", BAD_CONSTRUCTIONS)
def test_bad_hyperparameters_raise_at_construction(loss_class, kwargs, name):
    with pytest.raises(ValueError, match=name):
        loss_class(**kwargs)


@pytest.mark.parametrize("loss_name", LOSSES)
def test_degenerate_batches_are_finite(loss_name):
    loss_fn = LOSSES[loss_name]()
    cases = [
        (torch.randn(1, D), torch.tensor([3])),  # one sample
        (torch.randn(4, D), torch.tensor([2, 2, 2, 2])),  # one class
        (torch.zeros(3, D), torch.tensor([0, 1, 1])),  # zero vectors (normalise to 0)
        (torch.ones(3, D), torch.tensor([0, 1, 1])),  # identical points
    ]
    for embeddings, labels in cases:
        embeddings.requires_grad_()
        loss = loss_fn(embeddings, labels)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(embeddings.grad).all()


INTEGER_DTYPES = [torch.int8, torch.int16, torch.int32, torch.uint8] + [
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
]


@pytest.mark.parametrize("label_dtype", INTEGER_DTYPES, ids=str)
@pytest.mark.parametrize("loss_name", ALL_LOSSES)
def test_any_integer_label_dtype_gives_the_int64_result(loss_name, label_dtype):
    """PML's losses accept labels of any integer dtype; ours must too, with the
    int64 result (value and gradients), not a scatter()/gather() dtype error."""
    loss_fn = ALL_LOSSES[loss_name](C, D).to(DEVICE)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, D, generator=g).to(DEVICE).requires_grad_()
    labels = torch.tensor([0, 4, 4, 2, 0, 1], device=DEVICE)
    results = []
    for dtype in (torch.int64, label_dtype):
        loss = loss_fn(x, labels.to(dtype))
        results.append([loss, *torch.autograd.grad(loss, [x, *loss_fn.parameters()])])
    for got, expected in zip(*results):
        assert torch.equal(got, expected)


@pytest.mark.skipif(not hasattr(torch, "uint64"), reason="torch without uint16/32/64")
@pytest.mark.parametrize("loss_name", ALL_LOSSES)
def test_wide_unsigned_labels_out_of_range_are_named(loss_name):
    """uint16/32/64 labels, which torch's min and max do not take, are checked like the others:
    too large for num_classes, or (uint64) too large for an index, a ValueError naming them."""
    loss_fn = ALL_LOSSES[loss_name](C, D)
    for dtype in (torch.uint16, torch.uint32, torch.uint64) if loss_name in NEEDS_NUM_CLASSES else ():
        with pytest.raises(ValueError, match=r"labels must be in \[0, num_classes=5\).*got max 7"):
            loss_fn(x, torch.tensor([0, 1, 7], dtype=dtype))
    huge = torch.tensor([0, 1, 2**63 + 5], dtype=torch.uint64)
    with pytest.raises(ValueError, match="labels must be class indices below 2\\*\\*63"):
        loss_fn(x, huge)


def test_integer_label_dtypes_with_a_reference_set():
    loss_fn = losses.ClassWiseMultiSimilarityLoss()
    ref, ref_labels = torch.randn(4, D), torch.tensor([1, 0, 3, 3])
    expected = loss_fn(x, y, ref_emb=ref, ref_labels=ref_labels)
    for dtype in INTEGER_DTYPES:
        assert torch.equal(loss_fn(x, y.to(dtype), ref_emb=ref, ref_labels=ref_labels.to(dtype)), expected)


def test_reference_set_of_another_dtype_is_refused():
    loss_fn = losses.ClassWiseMultiSimilarityLoss()
    with pytest.raises(
        TypeError, match="ref_emb has dtype torch.float64 but embeddings has dtype torch.float32"
    ):
        loss_fn(x, y, ref_emb=torch.randn(2, D, dtype=torch.float64), ref_labels=torch.tensor([0, 1]))


@pytest.mark.skipif(DEVICE.type == "cpu", reason="needs TEST_DEVICE other than cpu")
def test_labels_and_reference_set_on_other_devices():
    """Labels on the CPU with embeddings on the device are moved (as PML does);
    a reference set on another device is refused by name."""
    loss_fn = losses.ClassWiseMultiSimilarityLoss()
    on_device = loss_fn(x.to(DEVICE), y.to(DEVICE))
    torch.testing.assert_close(loss_fn(x.to(DEVICE), y), on_device)
    with pytest.raises(ValueError, match="ref_emb is on cpu"):
        loss_fn(x.to(DEVICE), y, ref_emb=torch.randn(2, D), ref_labels=torch.tensor([0, 1]))


def test_zero_dimensional_embeddings_are_refused():
    with pytest.raises(ValueError, match="embeddings have dimension 0"):
        losses.ClassWiseMultiSimilarityLoss()(torch.randn(3, 0), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("loss_name", ALL_LOSSES)
def test_huge_finite_embeddings_normalise_like_unit_ones(loss_name, dtype):
    """~1e19 in float32 (1e300 in float64): ||x|| overflows, and x / ||x|| was a
    zero vector with a zero gradient. The losses normalise them correctly: the
    value is that of the same directions at unit scale, the gradient that one
    divided by the scale (the losses are scale-invariant per row)."""
    huge = 1e19 if dtype == torch.float32 else 1e300
    loss_fn = ALL_LOSSES[loss_name](C, D).to(DEVICE, dtype)
    g = torch.Generator().manual_seed(3)
    unit = torch.nn.functional.normalize(torch.randn(6, D, generator=g, dtype=torch.float64), dim=1)
    labels = torch.tensor([0, 4, 4, 2, 0, 1], device=DEVICE)
    small = unit.to(DEVICE, dtype).requires_grad_()
    large = (unit * huge).to(DEVICE, dtype).requires_grad_()
    expected = loss_fn(small, labels)
    (expected_grad,) = torch.autograd.grad(expected, [small])
    loss = loss_fn(large, labels)
    (grad,) = torch.autograd.grad(loss, [large])
    assert torch.isfinite(loss) and (grad != 0).any()
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(loss, expected, **tol)
    torch.testing.assert_close(
        grad * huge, expected_grad, rtol=tol["rtol"], atol=tol["rtol"] * expected_grad.abs().max()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "loss_class", [losses.MeanFieldContrastiveLoss, losses.MeanFieldClassWiseMultiSimilarityLoss]
)
def test_huge_mean_fields_normalise_like_unit_ones(loss_class, dtype):
    """The mean fields are normalised on every use like the embeddings: huge rows
    (a diverged run, a user's initialisation) must not become zero vectors."""
    huge = 1e20 if dtype == torch.float32 else 1e300
    loss_fn = loss_class(C, D, mf_reg_weight=0.5).to(DEVICE, dtype)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, D, generator=g, dtype=torch.float64).to(DEVICE, dtype)
    labels = torch.tensor([0, 4, 4, 2, 0, 1], device=DEVICE)
    expected = loss_fn(x, labels)
    (expected_grad,) = torch.autograd.grad(expected, [loss_fn.mean_fields])
    with torch.no_grad():
        loss_fn.mean_fields.mul_(huge)
    loss = loss_fn(x, labels)
    (grad,) = torch.autograd.grad(loss, [loss_fn.mean_fields])
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(loss, expected, **tol)
    torch.testing.assert_close(
        grad * huge, expected_grad, rtol=tol["rtol"], atol=tol["rtol"] * expected_grad.abs().max()
    )


def relational(base_classes, branch_classes):
    """The DRML head and a RelationalLoss around ProxyAnchorLoss, whose branch losses may
    have another num_classes than the base loss."""
    torch.manual_seed(0)
    embedder = RelationalEmbedder(8, D * 2, 2)
    loss_fn = losses.RelationalLoss(
        ProxyAnchorLoss(base_classes, D * 2),
        branch_losses=lambda: ProxyAnchorLoss(branch_classes, D),
        num_branches=2,
        embedding_size=D * 2,
    )
    return embedder, loss_fn


@pytest.mark.parametrize(
    "base_classes, branch_classes, owner",
    [(10, 3, r"branch_losses\[0\] \(ProxyAnchorLoss\)"), (3, 10, r"base_loss \(ProxyAnchorLoss\)")],
)
def test_relational_loss_refuses_labels_beyond_any_wrapped_loss(base_classes, branch_classes, owner):
    """PML's proxy losses do not check their labels (one_hot's raw error, or an index out of
    range): the RelationalLoss checks them against the smallest num_classes it wraps."""
    embedder, loss_fn = relational(base_classes, branch_classes)
    features = torch.randn(4, 8)
    with pytest.raises(ValueError, match=rf"labels must be in \[0, num_classes=3\) of {owner}, got max 9"):
        loss_fn(embedder(features), torch.tensor([0, 1, 9, 2]))
    with pytest.raises(ValueError, match="labels must be >= 0, got min -1"):
        loss_fn(embedder(features), torch.tensor([0, 1, -1, 2]))
    assert torch.isfinite(loss_fn(embedder(features), torch.tensor([0, 1, 2, 2])))


def per_class_losses():
    """Every loss of ours with num_classes, built with C classes: (embedder or None, loss)."""
    built = {}
    for declaration in DECLARATIONS:
        if declaration.per_class:
            entry = catalog.LOSSES[declaration.bench_name]
            embedder = entry.embedder(8, D * 4) if entry.embedder else None
            built[declaration.bench_name] = (embedder, catalog.published(entry.name)(C, D * 4))
    return built


PER_CLASS_LOSSES = per_class_losses()


@pytest.mark.parametrize("loss_name", PER_CLASS_LOSSES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(labels=st.lists(st.integers(-3, 2 * C), min_size=1, max_size=6))
def test_every_loss_with_num_classes_refuses_labels_out_of_range(loss_name, labels):
    """Labels in [0, num_classes) compute; any other label gets one line naming num_classes
    (or >= 0) and the label found, never a torch or PML internal error."""
    embedder, loss_fn = PER_CLASS_LOSSES[loss_name]
    features = torch.randn(len(labels), 8 if embedder is not None else D * 4)
    embeddings = embedder(features) if embedder is not None else features
    labels = torch.tensor(labels)
    if labels.min() < 0:
        with pytest.raises(ValueError, match=rf"^labels must be >= 0, got min {int(labels.min())}$"):
            loss_fn(embeddings, labels)
    elif labels.max() >= C:
        message = rf"^labels must be in \[0, num_classes={C}\)( of base_loss \(\w+\))?, got max {int(labels.max())}$"
        with pytest.raises(ValueError, match=message):
            loss_fn(embeddings, labels)
    else:
        assert torch.isfinite(loss_fn(embeddings, labels))

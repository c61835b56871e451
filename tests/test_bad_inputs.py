"""Bad input gets a clear error naming the argument, never NaN or a torch internal error."""

import pytest
import torch

from pml_fieldlosses import losses

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

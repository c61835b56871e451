"""Input checks shared by the losses: clear errors instead of NaN or torch internals."""

import torch


def check_embeddings(embeddings, embedding_size=None, name="embeddings"):
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
    if embedding_size is not None and embeddings.shape[1] != embedding_size:
        raise ValueError(
            f"{name} have dimension {embeddings.shape[1]}, but the loss was built with embedding_size={embedding_size}"
        )
    if not torch.isfinite(embeddings).all():
        raise ValueError(f"{name} contain NaN or inf values")


def check_labels(labels, embeddings, num_classes=None, name="labels", emb_name="embeddings"):
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
    if labels.numel() > 0 and labels.min() < 0:
        raise ValueError(f"{name} must be >= 0, got min {int(labels.min())}")
    if num_classes is not None and labels.numel() > 0 and labels.max() >= num_classes:
        raise ValueError(f"{name} must be in [0, num_classes={num_classes}), got max {int(labels.max())}")


def ref_not_supported(loss, embeddings, labels, ref_emb, ref_labels):
    if ref_emb is not embeddings or ref_labels is not labels:
        raise ValueError(
            f"{type(loss).__name__} does not support ref_emb/ref_labels: its second "
            "operand is the learnable per-class parameter, not a reference set"
        )


def check_positive(name, value):
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def check_non_negative(name, value):
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")

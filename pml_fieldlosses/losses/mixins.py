import torch

from ..utils import checks
from ..utils.loss_utils import scale_rows_for_normalize, upcast_half


class CheckedForwardMixin:
    """Checks the inputs and computes the loss in at least float32.

    Put it first among the bases of a BaseMetricLossFunction subclass. Before
    PML's forward runs it

    * refuses bad input with a clear error: non-tensor, non-floating,
      empty, NaN/inf or wrongly sized embeddings; non-integer, mis-shaped,
      negative or (when the loss has ``num_classes``) too large labels; the
      same for ``ref_emb``/``ref_labels``, and a ``ref_emb`` of another dtype
      or device than ``embeddings``;
    * turns integer labels of any integer dtype (int8/16/32, uint8, ...) into
      int64 on the embeddings' device, as torch's indexing needs;
    * when the loss's distance L2-normalises the embeddings, divides rows
      with entries above 1 by a power of two first (exact, see
      ``scale_rows_for_normalize``), so that huge but finite embeddings
      (~1e19 in float32) normalise correctly instead of to zero vectors;
    * upcasts float16/bfloat16 embeddings to float32 and turns autocast off,
      so learnable parameters are never cast below float32 and the exp/log
      terms cannot overflow. The loss is returned in float32 and the gradient
      flows back to the half-precision embeddings in their own dtype, as
      torch's cast sends it: inf where it exceeds float16's range, which a
      GradScaler detects (a clamped gradient would be clipped unseen).
    """

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        num_classes = getattr(self, "num_classes", None)
        checks.check_embeddings(embeddings, getattr(self, "embedding_size", None))
        checks.check_labels(labels, embeddings, num_classes)
        labels = checks.as_index_labels(labels, embeddings)
        if ref_emb is not None:
            checks.check_embeddings(ref_emb, embeddings.shape[1], name="ref_emb")
            checks.check_same_kind(ref_emb, embeddings)
            checks.check_labels(ref_labels, ref_emb, num_classes, "ref_labels", "ref_emb")
            ref_labels = checks.as_index_labels(ref_labels, ref_emb)
        elif ref_labels is not None:
            raise ValueError("ref_labels was given without ref_emb")
        embeddings, ref_emb = upcast_half(embeddings), upcast_half(ref_emb)
        if getattr(getattr(self, "distance", None), "normalize_embeddings", False):
            embeddings, ref_emb = scale_rows_for_normalize(embeddings), scale_rows_for_normalize(ref_emb)
        with torch.autocast(embeddings.device.type, enabled=False):
            return super().forward(embeddings, labels, indices_tuple, ref_emb, ref_labels)

import torch

from ..utils import checks
from ..utils.loss_utils import upcast_half


class CheckedForwardMixin:
    """Checks the inputs and computes the loss in at least float32.

    Put it first among the bases of a BaseMetricLossFunction subclass. Before
    PML's forward runs it

    * refuses bad input with a clear error: non-tensor, non-floating,
      empty, NaN/inf or wrongly sized embeddings; non-integer, mis-shaped,
      negative or (when the loss has ``num_classes``) too large labels; the
      same for ``ref_emb``/``ref_labels``;
    * upcasts float16/bfloat16 embeddings to float32 and turns autocast off,
      so learnable parameters are never cast below float32 and the exp/log
      terms cannot overflow. The loss is returned in float32 and the gradient
      flows back to the half-precision embeddings in their own dtype
      (saturated at its largest finite value, never inf).
    """

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None):
        num_classes = getattr(self, "num_classes", None)
        checks.check_embeddings(embeddings, getattr(self, "embedding_size", None))
        checks.check_labels(labels, embeddings, num_classes)
        if ref_emb is not None:
            checks.check_embeddings(ref_emb, embeddings.shape[1], name="ref_emb")
            checks.check_labels(ref_labels, ref_emb, num_classes, "ref_labels", "ref_emb")
        elif ref_labels is not None:
            raise ValueError("ref_labels was given without ref_emb")
        with torch.autocast(embeddings.device.type, enabled=False):
            return super().forward(
                upcast_half(embeddings),
                labels,
                indices_tuple,
                upcast_half(ref_emb),
                ref_labels,
            )

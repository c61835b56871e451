import torch
from pytorch_metric_learning.losses import CrossBatchMemory
from pytorch_metric_learning.utils import common_functions as c_f

from .declarations import DECLARATIONS


class CrossBatchMemoryWithClassWiseMultiSimilarity(CrossBatchMemory):
    """PML's CrossBatchMemory, also accepting our pair-based ClassWiseMultiSimilarityLoss.

    Behaves exactly like ``pytorch_metric_learning.losses.CrossBatchMemory``
    (same arguments, memory, miner and self-comparison handling); it only
    extends ``supported_losses()``, the hook PML provides for this (the
    upstream kit adds the name to PML's own list instead). The loss then
    compares the batch (queries) with the memory (references), over all
    batch-memory pairs except each sample with its own memory copy (or over
    the mined pairs with a miner).

    Our other losses (second operand a learnable per-class parameter, or the
    DRML head's outputs for the current batch) have no use for a memory of past
    embeddings and are refused with a ValueError.

    A call under torch.inference_mode() (a validation loss) works as under
    torch.no_grad(): it also enqueues the batch, and the memory stays an ordinary
    tensor that later training steps update in place (PML's own wrapper re-creates
    it as an inference tensor when it casts it under inference mode).
    """

    def forward(self, embeddings, labels, indices_tuple=None, enqueue_mask=None):
        if torch.is_tensor(embeddings) and torch.is_tensor(labels):
            # PML casts the memory to the batch's dtype and device on every call: done first
            # here, outside inference mode, so that PML's cast is a no-op
            with torch.inference_mode(False):
                device = embeddings.device
                self.embedding_memory = c_f.to_device(
                    self.embedding_memory, device=device, dtype=embeddings.dtype
                )
                self.label_memory = c_f.to_device(self.label_memory, device=device, dtype=labels.dtype)
        return super().forward(embeddings, labels, indices_tuple, enqueue_mask)

    def reset_queue(self):
        with torch.inference_mode(False):  # ordinary tensors, also when called under inference mode
            super().reset_queue()

    @staticmethod
    def supported_losses():
        return CrossBatchMemory.supported_losses() + ["ClassWiseMultiSimilarityLoss"]

    @classmethod
    def check_loss_support(cls, loss_name):
        ours = {d.loss_class.__name__ for d in DECLARATIONS}
        if loss_name not in cls.supported_losses() and loss_name in ours:
            raise ValueError(
                f"CrossBatchMemory makes no sense for {loss_name}: it does not compare embeddings with "
                "a reference set of other embeddings (it uses learnable per-class parameters, or the "
                "embedder's outputs for the current batch), so a memory of past embeddings would never be used"
            )
        super().check_loss_support(loss_name)

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses

from pml_fieldlosses import losses

from . import naive
from .helpers import assert_close


def test_class_wise_multi_similarity_in_memory_matches_the_concatenated_memory():
    torch.manual_seed(0)
    D, memory_size = 5, 20
    memory = losses.CrossBatchMemoryWithClassWiseMultiSimilarity(
        losses.ClassWiseMultiSimilarityLoss(alpha=2.0, beta=10.0, base=0.5), D, memory_size=memory_size
    )
    batches = [torch.randn(8, D, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    labels = [torch.randint(0, 4, (8,)) for _ in range(3)]
    for x, y in zip(batches, labels):
        loss = memory(x, y)
    # third batch: the memory holds batches 1-3 (24 > 20: the oldest 4 rows were overwritten)
    stored = torch.cat(batches).detach()
    stored_labels = torch.cat(labels)
    slots = torch.arange(24) % memory_size
    mem, mem_labels = (
        torch.zeros(memory_size, D, dtype=torch.float64),
        torch.zeros(memory_size, dtype=torch.long),
    )
    mem[slots], mem_labels[slots] = stored, stored_labels
    x, y = batches[2], labels[2]
    own_slot = {i: int(slots[16 + i]) for i in range(8)}  # a sample is not compared with its own copy
    pairs = {(i, j) for i in range(8) for j in range(memory_size) if j != own_slot[i]}
    x64 = x.detach().clone().requires_grad_()
    expected = naive.class_wise_multi_similarity(
        x64, y.tolist(), 2.0, 10.0, 0.5, ref=mem, ref_y=mem_labels.tolist(), pairs=pairs
    )
    assert_close(loss, expected, torch.float64)
    loss.backward()
    expected.backward()
    assert_close(x.grad, x64.grad, torch.float64)


def test_other_losses_keep_pml_behaviour():
    ours = losses.CrossBatchMemoryWithClassWiseMultiSimilarity.supported_losses()
    assert ours[:-1] == pml_losses.CrossBatchMemory.supported_losses()
    assert ours[-1] == "ClassWiseMultiSimilarityLoss"
    memory = losses.CrossBatchMemoryWithClassWiseMultiSimilarity(
        pml_losses.ContrastiveLoss(), 4, memory_size=8
    )
    assert torch.isfinite(memory(torch.randn(4, 4), torch.tensor([0, 0, 1, 1])))
    with pytest.raises(Exception, match="not supported for ProxyAnchorLoss"):
        losses.CrossBatchMemoryWithClassWiseMultiSimilarity(pml_losses.ProxyAnchorLoss(3, 4), 4)


@pytest.mark.parametrize(
    "loss", [losses.MeanFieldContrastiveLoss(3, 4), losses.MeanFieldClassWiseMultiSimilarityLoss(3, 4)]
)
def test_losses_with_per_class_parameters_are_refused(loss):
    with pytest.raises(ValueError, match=f"CrossBatchMemory makes no sense for {type(loss).__name__}"):
        losses.CrossBatchMemoryWithClassWiseMultiSimilarity(loss, 4)

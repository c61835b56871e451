import pytest
import torch
from pytorch_metric_learning import distances, miners, reducers

from pml_fieldlosses import losses

from . import naive
from .helpers import DEVICE, DTYPES, assert_close, gradients

LABELS = torch.tensor([0, 0, 1, 1, 1, 4, 7, 7, 7, 7])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "miner", [miners.MultiSimilarityMiner(epsilon=0.1), miners.TripletMarginMiner(margin=0.5)]
)
def test_mined_pairs_match_naive(miner, dtype):
    torch.manual_seed(0)
    x = torch.randn(len(LABELS), 6, dtype=torch.float64).to(DEVICE, dtype).requires_grad_()
    labels = LABELS.to(DEVICE)
    indices_tuple = miner(x, labels)
    loss = losses.ClassWiseMultiSimilarityLoss(alpha=2.0, beta=10.0, base=0.5)(x, labels, indices_tuple)
    if len(indices_tuple) == 3:
        a, p, n = (t.tolist() for t in indices_tuple)
        pairs = set(zip(a, p)) | set(zip(a, n))
    else:
        a1, p, a2, n = (t.tolist() for t in indices_tuple)
        pairs = set(zip(a1, p)) | set(zip(a2, n))
    assert 0 < len(pairs) < len(LABELS) ** 2
    x64 = x.detach().double().requires_grad_()
    expected = naive.class_wise_multi_similarity(x64, LABELS.tolist(), 2.0, 10.0, 0.5, pairs=pairs)
    assert_close(loss, expected, dtype)
    assert_close(gradients(loss, [x])[0], gradients(expected, [x64])[0], dtype)


def test_miner_without_pairs_gives_zero_loss():
    x = torch.randn(len(LABELS), 6, requires_grad=True)
    empty = torch.tensor([], dtype=torch.long)
    loss = losses.ClassWiseMultiSimilarityLoss()(x, LABELS, (empty, empty, empty, empty))
    loss.backward()
    assert loss.item() == 0 and torch.all(x.grad == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sub_losses_have_one_element_per_class(dtype):
    torch.manual_seed(0)
    x = torch.randn(len(LABELS), 6, dtype=torch.float64).to(DEVICE, dtype)
    labels = LABELS.to(DEVICE)
    parts = losses.ClassWiseMultiSimilarityLoss(reducer=reducers.DoNothingReducer())(x, labels)
    assert set(parts) == {"pos_loss", "neg_loss"}
    for part in parts.values():
        assert part["reduction_type"] == "element"
        assert torch.equal(labels[part["indices"]], labels.unique())
    total = parts["pos_loss"]["losses"].sum() + parts["neg_loss"]["losses"].sum()
    assert_close(losses.ClassWiseMultiSimilarityLoss(reducer=reducers.SumReducer())(x, labels), total, dtype)
    assert_close(losses.ClassWiseMultiSimilarityLoss()(x, labels), total / 4, dtype)


def test_hyperparameters_are_recordable_and_checked():
    loss_fn = losses.ClassWiseMultiSimilarityLoss(alpha=0.5, beta=3, base=0.6)
    assert {"alpha", "beta", "base"} <= set(loss_fn._record_these)
    assert list(loss_fn.parameters()) == []
    for bad in [dict(alpha=0), dict(beta=-1)]:
        with pytest.raises(ValueError, match=list(bad)[0]):
            losses.ClassWiseMultiSimilarityLoss(**bad)
    with pytest.raises(AssertionError, match="CosineSimilarity"):
        losses.ClassWiseMultiSimilarityLoss(distance=distances.LpDistance())


def test_large_beta_stays_finite():
    # exponents beta * (1 - base) = 500 overflow a plain exp in float32
    x = torch.nn.functional.normalize(torch.randn(len(LABELS), 6), dim=1).requires_grad_()
    loss = losses.ClassWiseMultiSimilarityLoss(alpha=50.0, beta=1000.0, base=0.5)(x, LABELS)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()

"""The relational head's and loss's fast paths against the plain operations they replace
(docs/models.md, "Speed"): the reconstruction error's own backward and the skipped NaN/inf
scan of the head's own output."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning import losses

from pml_fieldlosses.losses import RelationalLoss
from pml_fieldlosses.models import RelationalEmbedder
from pml_fieldlosses.models.relational_embedder import ReconstructionError, known_finite
from pml_fieldlosses.utils import checks

from .helpers import assert_close


def plain_reconstruction_error(h, nodes, weight, bias):
    reconstruction = torch.einsum("bke,kie->bki", nodes, weight) + bias
    return (h - reconstruction).square().mean(dim=-1)


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 7),
    K=st.integers(1, 4),
    n_in=st.integers(1, 6),
    E=st.integers(1, 5),
    frozen=st.sampled_from([None, "weight", "bias"]),
    seed=st.integers(0, 2**16),
)
def test_reconstruction_error_and_its_gradients_equal_the_plain_ops(batch, K, n_in, E, frozen, seed):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(batch, K, n_in, generator=generator, dtype=torch.float64)
    nodes = torch.randn(batch, K, E, generator=generator, dtype=torch.float64)
    weight = torch.randn(K, n_in, E, generator=generator, dtype=torch.float64).requires_grad_(
        frozen != "weight"
    )
    bias = torch.randn(K, n_in, generator=generator, dtype=torch.float64).requires_grad_(frozen != "bias")
    upstream = torch.randn(batch, K, generator=generator, dtype=torch.float64)
    params = [p for p in (weight, bias) if p.requires_grad]
    fast = ReconstructionError.apply(h, nodes, weight, bias)
    plain = plain_reconstruction_error(h, nodes, weight, bias)
    assert_close(fast, plain, torch.float64)
    for got, expected in zip(
        torch.autograd.grad(fast, params, upstream), torch.autograd.grad(plain, params, upstream)
    ):
        assert_close(got, expected, torch.float64)


def test_the_head_uses_the_plain_reconstruction_ops_under_autocast():
    """The fast path is for float32/float64 outside autocast; under autocast the plain
    ops run (the decoders in the autocast dtype, the error in float32)."""
    torch.manual_seed(0)
    head = RelationalEmbedder(8, 4, 2).train()
    features = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        errors = head(features).branch_outputs.errors
    assert errors.dtype == torch.float32
    assert type(errors.grad_fn).__name__ != "ReconstructionErrorBackward"
    plain = head(features).branch_outputs.errors
    assert type(plain.grad_fn).__name__ == "ReconstructionErrorBackward"


def test_known_finite_only_for_the_heads_unchanged_training_output():
    torch.manual_seed(0)
    head = RelationalEmbedder(8, 4, 2).train()
    features = torch.randn(5, 8)
    out = head(features)
    assert known_finite(out)
    assert not known_finite(out * 1)
    assert not known_finite(out.detach())
    assert not known_finite(features)
    assert not known_finite("not a tensor")
    with torch.no_grad():
        out.mul_(2)
    assert not known_finite(out)
    assert not known_finite(head.eval()(features))
    with torch.inference_mode():
        assert not known_finite(head.train()(features))


def test_check_embeddings_scans_for_nan_unless_told_the_values_are_finite():
    bad = torch.tensor([[1.0, float("nan")]])
    with pytest.raises(ValueError, match="NaN or inf"):
        checks.check_embeddings(bad)
    checks.check_embeddings(bad, finite=False)  # the caller's word
    with pytest.raises(ValueError, match="dimension 2"):
        checks.check_embeddings(bad, embedding_size=3, finite=False)  # the other checks remain


def test_non_finite_embeddings_without_a_fresh_head_output_are_still_refused():
    torch.manual_seed(0)
    head = RelationalEmbedder(8, 4, 2).train()
    loss_fn = RelationalLoss(
        losses.ProxyAnchorLoss(3, 4), branch_losses=lambda: losses.ProxyAnchorLoss(3, 2), num_branches=2
    )
    out = head(torch.randn(5, 8))
    with torch.no_grad():
        out[0, 0] = float("nan")  # an in-place change: the branch outputs are stale, the scan runs
    with pytest.raises(ValueError, match="NaN or inf"):
        loss_fn(out, torch.tensor([0, 1, 2, 0, 1]))

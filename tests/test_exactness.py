"""Vectorised losses against the naive loop references, value and gradients."""

import pytest
import torch

from .helpers import (
    CWMS_CASES,
    DTYPES,
    EMBEDDING_SIZE,
    LABEL_PATTERNS,
    MF_CASES,
    NUM_CLASSES,
    assert_close,
    generator_for,
    gradients,
    make_embeddings,
    make_labels,
)


def random_mean_fields(loss_fn, generator):
    with torch.no_grad():
        loss_fn.mean_fields.copy_(torch.randn(NUM_CLASSES, EMBEDDING_SIZE, generator=generator))


@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", LABEL_PATTERNS)
@pytest.mark.parametrize("case", MF_CASES)
def test_mean_field_losses_match_naive(case, pattern, dtype, normalized):
    g = generator_for(case, pattern, dtype, normalized)
    build, reference = MF_CASES[case]
    labels = make_labels(pattern, g)
    x = make_embeddings(len(labels), dtype, g, normalized).requires_grad_()
    loss_fn = build()
    random_mean_fields(loss_fn, g)
    loss = loss_fn(x, torch.tensor(labels))
    assert loss.dtype == dtype and loss_fn.mean_fields.dtype == dtype
    grad_x, grad_w = gradients(loss, [x, loss_fn.mean_fields])

    x64 = x.detach().double().requires_grad_()
    w64 = loss_fn.mean_fields.detach().double().requires_grad_()
    expected = reference(x64, labels, w64)
    expected_grad_x, expected_grad_w = gradients(expected, [x64, w64])

    assert_close(loss, expected, dtype)
    assert_close(grad_x, expected_grad_x, dtype)
    assert_close(grad_w, expected_grad_w, dtype)


@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", LABEL_PATTERNS)
@pytest.mark.parametrize("case", CWMS_CASES)
def test_class_wise_multi_similarity_matches_naive(case, pattern, dtype, normalized):
    g = generator_for(case, pattern, dtype, normalized)
    build, reference = CWMS_CASES[case]
    labels = make_labels(pattern, g)
    x = make_embeddings(len(labels), dtype, g, normalized).requires_grad_()
    loss = build()(x, torch.tensor(labels))
    (grad_x,) = gradients(loss, [x])

    x64 = x.detach().double().requires_grad_()
    expected = reference(x64, labels)
    (expected_grad_x,) = gradients(expected, [x64])

    assert_close(loss, expected, dtype)
    assert_close(grad_x, expected_grad_x, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CWMS_CASES)
def test_class_wise_multi_similarity_with_ref_matches_naive(case, dtype):
    g = generator_for(case, "ref", dtype)
    build, reference = CWMS_CASES[case]
    labels = [0, 0, 3, 5, 5, 5]
    ref_labels = [3, 3, 0, 7, 7, 5, 1, 0]  # classes 7 and 1 only in the reference set
    x = make_embeddings(len(labels), dtype, g).requires_grad_()
    ref = make_embeddings(len(ref_labels), dtype, g).requires_grad_()
    loss = build()(x, torch.tensor(labels), ref_emb=ref, ref_labels=torch.tensor(ref_labels))
    grad_x, grad_ref = gradients(loss, [x, ref])

    x64, ref64 = (t.detach().double().requires_grad_() for t in (x, ref))
    expected = reference(x64, labels, ref=ref64, ref_y=ref_labels)
    expected_grads = gradients(expected, [x64, ref64])

    assert_close(loss, expected, dtype)
    assert_close(grad_x, expected_grads[0], dtype)
    assert_close(grad_ref, expected_grads[1], dtype)


@pytest.mark.parametrize("case", list(MF_CASES) + list(CWMS_CASES))
def test_gradcheck_float64(case):
    g = generator_for(case, "gradcheck")
    labels = torch.tensor([0, 0, 2, 2, 2, 5, 1])
    x = make_embeddings(len(labels), torch.float64, g).requires_grad_()
    if case in MF_CASES:
        loss_fn = MF_CASES[case][0]()
        random_mean_fields(loss_fn, g)
        loss_fn.double()
        w = loss_fn.mean_fields

        def func(x, w):
            return loss_fn(x, labels)

        assert torch.autograd.gradcheck(func, (x, w))
    else:
        loss_fn = CWMS_CASES[case][0]()
        assert torch.autograd.gradcheck(lambda x: loss_fn(x, labels), (x,))

"""Vectorised losses against the naive loop references, value and gradients,
and against numbers produced by the official implementation (tests/data)."""

import json
import pathlib

import pytest
import torch

from pml_fieldlosses import losses

from .helpers import (
    CWMS_CASES,
    DEVICE,
    DTYPES,
    EMBEDDING_SIZE,
    LABEL_PATTERNS,
    LOSS_DTYPE,
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
    x = make_embeddings(len(labels), dtype, g, normalized, device=DEVICE).requires_grad_()
    loss_fn = build()
    random_mean_fields(loss_fn, g)
    loss_fn.to(DEVICE)
    loss = loss_fn(x, torch.tensor(labels, device=DEVICE))
    assert loss.dtype == LOSS_DTYPE.get(dtype, dtype) and loss_fn.mean_fields.dtype == loss.dtype
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
    x = make_embeddings(len(labels), dtype, g, normalized, device=DEVICE).requires_grad_()
    loss = build()(x, torch.tensor(labels, device=DEVICE))
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
    x = make_embeddings(len(labels), dtype, g, device=DEVICE).requires_grad_()
    ref = make_embeddings(len(ref_labels), dtype, g, device=DEVICE).requires_grad_()
    loss = build()(
        x,
        torch.tensor(labels, device=DEVICE),
        ref_emb=ref,
        ref_labels=torch.tensor(ref_labels, device=DEVICE),
    )
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


OFFICIAL = json.loads((pathlib.Path(__file__).parent / "data" / "official_mf_reference.json").read_text())
OUR_CLASSES = {
    "MeanFieldContrastiveLoss": losses.MeanFieldContrastiveLoss,
    "MeanFieldClassWiseMultiSimilarityLoss": losses.MeanFieldClassWiseMultiSimilarityLoss,
    "ClassWiseMultiSimilarityLoss": losses.ClassWiseMultiSimilarityLoss,
}
OUR_NAMES = {"mf_reg": "mf_reg_weight", "mf_power": "mf_reg_power"}


@pytest.mark.parametrize("case", OFFICIAL["cases"], ids=lambda c: f"{c['loss']}-{c['inputs']}")
def test_matches_official_implementation(case):
    """Same value and gradients as st-tech/mft-in-dml run in float64
    (scripts/official_mf/make_reference.py), to 1e-12 relative."""
    kwargs = {OUR_NAMES.get(k, k): v for k, v in case["hyperparameters"].items()}
    cls = OUR_CLASSES[case["official_class"]]
    x = torch.tensor(case["embeddings"], dtype=torch.float64, device=DEVICE, requires_grad=True)
    labels = torch.tensor(case["labels"], device=DEVICE)
    if "mean_fields" in case:
        shape = case["shape"]
        loss_fn = cls(shape["num_classes"], shape["embedding_size"], **kwargs).to(DEVICE, torch.float64)
        with torch.no_grad():
            loss_fn.mean_fields.copy_(torch.tensor(case["mean_fields"], dtype=torch.float64))
        inputs = [x, loss_fn.mean_fields]
    else:
        loss_fn = cls(**kwargs)
        inputs = [x]
    loss = loss_fn(x, labels)
    grads = gradients(loss, inputs)
    expected = [case["value"], case["grad_embeddings"], case.get("grad_mean_fields")]
    for got, want in zip([loss, *grads], expected):
        assert_close(got, torch.tensor(want, dtype=torch.float64), torch.float64)

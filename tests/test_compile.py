"""torch.compile of every loss of ours and of the DRML head: one forward and backward, the
compiled value and gradients against eager (docs/losses.md, "Inference mode and torch.compile").

Each compile runs in a subprocess (this file run as a script), so that a native crash of a
generated kernel (inductor's C++ on CPU) fails the test instead of killing pytest. The default
run compiles our losses on a plain embedder with the aot_eager backend (the traced graphs,
autograd included, without code generation) and the mean-field class-wise MultiSimilarity
loss, which inductor once miscompiled, with inductor; ``-m slow`` compiles every case,
the DRML head and the potential losses' scalable path (its search of all pairs and its
neighbour list) included, with both backends (about 10 minutes on 2 busy cores, most of it
inductor's C++ compiles).
Inputs are float64, so that compiled and eager agree to rounding (a wrong gradient row is
not lost in float32 noise), and also float32 with inductor; the batch leaves a class absent
and has several samples per class.
"""

import json
import subprocess
import sys
import time

import pytest
import torch

from pml_fieldlosses.app import catalog

C, D, IN_FEATURES = 5, 8, 16
LABELS = [0, 0, 1, 1, 1, 3, 3, 4, 4, 4, 1, 0]  # class 2 absent
# compiled against eager: max |difference| over the value and each gradient, relative to the
# largest eager entry of that tensor (rounding differences: ~1e-15 in float64, ~1e-7 in float32)
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}
TIMEOUT = 600

# case -> (entry name in the loss table, options)
CASES = {
    "MFCont": ("MFCont", {"mf_reg_weight": 0.1}),
    "CWMS": ("CWMS", {}),
    "MFCWMS": ("MFCWMS", {"mf_reg_weight": 0.1}),
    "PFML-dense": ("PFML", {"dense": True}),
    "PFML-scalable": ("PFML", {"dense": False}),
    "CPML-dense": ("CPML", {"dense": True}),
    "CPML-scalable": ("CPML", {"dense": False}),
    "PFML-list": ("PFML", {"dense": False}),
    "CPML-list": ("CPML", {"dense": False}),
    "DRML-ProxyAnchor": ("DRML-ProxyAnchor", {}),
}
# attributes set on a case's loss: the scalable path's neighbour list, which these few points
# would not use (they are searched all at once)
ATTRIBUTES = {"PFML-list": {"all_pairs_entries": 0}, "CPML-list": {"all_pairs_entries": 0}}


# the cases of the default run's aot_eager test (the others: -m slow)
DEFAULT_AOT_EAGER = ["MFCont", "CWMS", "MFCWMS", "PFML-dense", "CPML-dense"]


def build(case, dtype):
    """(embedder, loss) of ``case`` in ``dtype``, seeded: the embedder is the DRML head for the
    DRML losses, else None (the loss takes the inputs as embeddings)."""
    name, options = CASES[case]
    entry = catalog.get_entry(name)
    torch.manual_seed(0)
    loss = catalog.published(name, **options)(C, D).to(dtype)
    for attribute, value in ATTRIBUTES.get(case, {}).items():
        setattr(loss, attribute, value)
    embedder = entry.embedder(IN_FEATURES, D).to(dtype) if entry.embedder else None
    return embedder, loss


def forward_backward(embedder, loss, inputs, labels):
    """The loss and its gradients with respect to the inputs and every parameter."""
    inputs = inputs.clone().requires_grad_()
    value = loss(embedder(inputs) if embedder is not None else inputs, labels)
    parameters = [p for m in (embedder, loss) if m is not None for p in m.parameters()]
    return [value, *torch.autograd.grad(value, [inputs, *parameters])]


def compare(case, backend, dtype_name):
    """Compiled against eager for ``case``: the largest relative difference, and seconds."""
    dtype = getattr(torch, dtype_name)
    embedder, loss = build(case, dtype)
    g = torch.Generator().manual_seed(1)
    size = IN_FEATURES if embedder is not None else D
    inputs = torch.randn(len(LABELS), size, generator=g, dtype=torch.float64).to(dtype)
    labels = torch.tensor(LABELS)
    expected = forward_backward(embedder, loss, inputs, labels)
    embedder, loss = build(case, dtype)  # fresh state (the neighbour list, PML's statistics)
    start = time.perf_counter()
    compiled_embedder = torch.compile(embedder, backend=backend) if embedder is not None else None
    got = forward_backward(compiled_embedder, torch.compile(loss, backend=backend), inputs, labels)
    seconds = time.perf_counter() - start
    error = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item() for a, b in zip(got, expected))
    return {
        "case": case,
        "backend": backend,
        "dtype": dtype_name,
        "error": error,
        "seconds": round(seconds, 1),
    }


def run_in_subprocess(backend, cases, dtypes=("float64",)):
    """compare() of each case in each dtype in a fresh interpreter; a crash or an exception
    fails the test."""
    command = [sys.executable, __file__, backend, ",".join(dtypes), *cases]
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torch.compile(backend={backend!r}) of {cases} did not finish in {TIMEOUT} s")
    if result.returncode != 0:
        how = f"signal {-result.returncode}" if result.returncode < 0 else f"exit {result.returncode}"
        pytest.fail(
            f"torch.compile(backend={backend!r}) of {cases} ended with {how} (a negative exit: a native "
            f"crash of the compiled code):\n{result.stderr[-4000:]}"
        )
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    expected = [(case, dtype) for case in cases for dtype in dtypes]
    assert [(row["case"], row["dtype"]) for row in rows] == expected, result.stdout + result.stderr[-4000:]
    for row in rows:
        assert row["error"] <= TOLERANCE[row["dtype"]], f"compiled and eager differ: {row}"
    return rows


def test_our_losses_compile_with_aot_eager():
    run_in_subprocess("aot_eager", DEFAULT_AOT_EAGER)


def test_mean_field_class_wise_multi_similarity_compiles_with_inductor():
    """Inductor (2.13, CPU) wrote past a C x C buffer in the backward of a transposed gather
    (a native crash) and zeroed the absent classes' gradient after an index_fill; the loss
    avoids both. float64 also compiles the rows' rescaling (scale_rows_for_normalize)."""
    run_in_subprocess("inductor", ["MFCWMS"], dtypes=("float32", "float64"))


@pytest.mark.slow
def test_every_other_case_compiles_with_aot_eager():
    run_in_subprocess("aot_eager", [case for case in CASES if case not in DEFAULT_AOT_EAGER])


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_case_compiles_with_inductor(case):
    run_in_subprocess("inductor", [case], dtypes=("float32", "float64"))


if __name__ == "__main__":
    for case in sys.argv[3:]:
        for dtype_name in sys.argv[2].split(","):
            print(json.dumps(compare(case, sys.argv[1], dtype_name)), flush=True)

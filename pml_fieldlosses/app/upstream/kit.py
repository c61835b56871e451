"""Apply the kit to a PML checkout and write the PR description."""

import argparse
import sys
from pathlib import Path

import torch

from ...losses.declarations import DECLARATIONS
from . import edits, sources, tests_copy
from .sources import KitError

REPO = sources.PACKAGE_DIR.parent
# the oldest torch the contributed losses run on: torch.Tensor.scatter_reduce (amax/amin,
# include_self) is stable from 2.0 (a prototype in 1.12/1.13); torch.autocast(device_type),
# checkpoint(use_reentrant=False) and torch.frexp are older
TORCH_FLOOR = "2.0"


def checkout_layout(checkout):
    checkout = Path(checkout)
    needed = [
        "src/pytorch_metric_learning/losses/__init__.py",
        "src/pytorch_metric_learning/losses/cross_batch_memory.py",
        "tests/__init__.py",
    ]
    missing = [p for p in needed if not (checkout / p).is_file()]
    if missing:
        raise KitError(f"{checkout} is not a pytorch-metric-learning checkout (missing {', '.join(missing)})")
    return checkout


def our_extra_supported_losses():
    """The losses our CrossBatchMemory accepts beyond PML's (through its supported_losses())."""
    from pytorch_metric_learning.losses import CrossBatchMemory

    import pml_fieldlosses.losses as ours

    names = set()
    for value in vars(ours).values():
        if isinstance(value, type) and issubclass(value, CrossBatchMemory) and value is not CrossBatchMemory:
            names |= set(value.supported_losses()) - set(CrossBatchMemory.supported_losses())
    return sorted(names)


def apply(checkout, tests_dir=None, docs=None):
    """Write the kit into ``checkout``; returns {path relative to the checkout: 'new' | 'edited'}."""
    checkout = checkout_layout(checkout)
    tests_dir = Path(tests_dir or REPO / "tests")
    docs = Path(docs or REPO / "docs" / "losses.md")
    if not (tests_dir / "naive.py").is_file() or not docs.is_file():
        raise KitError(
            "the kit runs from a source checkout of pml-fieldlosses "
            "(it reads tests/losses/, tests/naive*.py and docs/)"
        )
    written = {}

    def write(path, text):
        path = Path(path)
        old = path.read_text() if path.exists() else None
        if old != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        written[str(path.relative_to(checkout))] = (
            "new" if old is None else ("edited" if old != text else "unchanged")
        )

    modules = sources.closure()
    transformed = {m: sources.transform(m, checkout) for m in modules}  # all checks before writing
    exports = {}
    for module in modules:
        target = sources.target_module(module)
        if target.startswith("pytorch_metric_learning.losses."):
            names = sources.exported_classes(module)
            if names:
                exports[target.rsplit(".", 1)[1]] = names
    contributed = [d for d in DECLARATIONS if d.upstream]
    loss_names = [d.loss_class.__name__ for d in contributed]
    test_files = {}
    for declaration in contributed:
        relative = Path(declaration.test_file).relative_to("tests")
        if not (tests_dir / relative).is_file():
            raise KitError(
                f"{declaration.loss_class.__name__} has no PML-style test: add {declaration.test_file}"
            )
        test_files[relative] = tests_copy.pml_test_file(tests_dir, relative)
    sections = {
        n: edits.pml_doc_format(s, n, edits.defaults_from_code(*loss_factory(n)))
        for n, s in edits.doc_sections(docs.read_text(), loss_names).items()
    }

    for module, text in transformed.items():
        write(sources.target_path(checkout, module), text)
    for package, text in sources.new_packages(modules, checkout).items():
        write(sources.target_path(checkout, package).with_suffix("") / "__init__.py", text)
    init = checkout / "src/pytorch_metric_learning/losses/__init__.py"
    write(init, edits.add_exports(init.read_text(), exports))
    extra = our_extra_supported_losses()
    cbm = checkout / "src/pytorch_metric_learning/losses/cross_batch_memory.py"
    write(cbm, edits.add_supported_losses(cbm.read_text(), extra))
    for test in sorted((checkout / "tests").rglob("test_*.py")):
        if "CrossBatchMemory.supported_losses()" in test.read_text():
            write(test, edits.add_to_loss_lists(test.read_text(), extra))
    for relative, text in test_files.items():
        write(checkout / "tests" / relative, text)
    pml_docs = checkout / "docs/losses.md"
    if pml_docs.is_file():
        write(pml_docs, edits.add_doc_sections(pml_docs.read_text(), sections))
    return written


def loss_factory(name):
    """(class, a function building it at its defaults for C = 9 classes of D = 6 dimensions)."""
    declaration = next(d for d in DECLARATIONS if d.loss_class.__name__ == name)
    sizes = (9, 6) if declaration.per_class else ()
    return declaration.loss_class, lambda: declaration.loss_class(*sizes)


def pr_description(written):
    new = sorted(p for p, s in written.items() if s == "new")
    edited = sorted(p for p, s in written.items() if s == "edited")
    losses = [n for m in sources.LOSS_MODULES for n in sources.exported_classes(m)]
    return "\n".join(
        [
            "## Add mean-field and potential-field losses",
            "",
            "New losses: " + ", ".join(f"`{n}`" for n in losses) + ".",
            "",
            "* *Mean Field Theory in Deep Metric Learning* (Furusawa, ICLR 2024): MeanFieldContrastiveLoss, "
            "ClassWiseMultiSimilarityLoss, MeanFieldClassWiseMultiSimilarityLoss (values as the official "
            "st-tech/mft-in-dml code).",
            "* *Potential Field Based Deep Metric Learning* (Bhatnagar & Ahuja, CVPR 2025): PotentialFieldLoss "
            "and its contrastive ablation ContrastivePotentialLoss.",
            "* `ClassWiseMultiSimilarityLoss` is pair-based and works with `CrossBatchMemory` "
            "(added to `supported_losses()` and to the list in tests/losses/test_cross_batch_memory.py).",
            "",
            "New files:",
            *[f"* `{p}`" for p in new],
            "",
            "Edited:",
            *[f"* `{p}`" for p in edited],
            "",
            "### Tests",
            "One unittest file per loss comparing the value and the gradients (embeddings and the "
            "learnable mean fields / proxies) with naive loop references written from the papers' "
            "equations, for every dtype of TEST_DTYPES (relative tolerance 1e-12 in float64, 1e-4 in "
            "float32, 1e-2 in float16) on TEST_DEVICE.",
            f"Tested with `TEST_DTYPES=float32,float64 TEST_DEVICE=cpu python -m unittest discover -t . "
            f"-s tests/losses` (and tests/utils) on torch {torch.__version__}, Python "
            f"{sys.version.split()[0]}.",
            "",
            "### Points for the maintainer",
            f"* **torch floor**: these losses need torch >= {TORCH_FLOOR} (`Tensor.scatter_reduce` with "
            "amax/amin and `include_self`, stable from 2.0). They import on older torch (the package "
            "still imports on the 1.6 CI job), but their tests need >= 2.0: the 1.6 job would fail "
            "them; skipping them there (or raising the job's torch) is your call.",
            "* **Precision policy**: float16/bfloat16 embeddings are upcast to float32 and the loss is "
            "computed with autocast disabled, so learnable parameters (mean fields, proxies) stay float32 "
            "under autocast and the exp/log terms cannot overflow; the loss is returned in float32 and "
            "the gradient flows back to the half-precision embeddings in their dtype (saturated at its "
            "largest finite value). PML's own losses instead follow the input dtype; tell us if you "
            "prefer that.",
            "* Helpers: input checks (`utils/checks.py`), grouped log-sum-exp and normalisation helpers "
            "(`utils/loss_utils.py`), the potential losses' machinery "
            "(`losses/potential/`: the energy, the candidate searches, the pair searches and the "
            "neighbour list), and `losses/checked_forward_mixin.py` (the checks and the precision "
            "policy above, shared by the five losses).",
            "* Formatting: our line length is 110; run `format_code.sh` (black/isort) before merging.",
        ]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pml_fieldlosses.app.upstream",
        description="Write our losses, their tests and docs into a pytorch-metric-learning checkout "
        "and print a pull-request description.",
    )
    parser.add_argument("checkout", help="path of a pytorch-metric-learning checkout (with src/ and tests/)")
    args = parser.parse_args(argv)
    try:
        written = apply(args.checkout)
    except KitError as error:
        raise SystemExit(f"upstream kit: {error}") from None
    print(pr_description(written))

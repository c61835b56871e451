"""Apply the kit to a PML checkout and write the PR description."""

import argparse
import ast
import os
import re
import sys
from pathlib import Path

import torch

from ...losses.declarations import DECLARATIONS
from ..errors import FileFault, file_fault
from . import edits, sources, tests_copy, writer
from .sources import KitError

REPO = sources.PACKAGE_DIR.parent
# the oldest torch the contributed losses run on: torch.Tensor.scatter_reduce (amax/amin,
# include_self) is stable from 2.0 (a prototype in 1.12/1.13); torch.autocast(device_type),
# checkpoint(use_reentrant=False) and torch.frexp are older
TORCH_FLOOR = "2.0"


# the pytorch-metric-learning versions the kit writes for: those our losses support (the
# dependency in pyproject.toml), from 2.5 up to, not including, 3
PML_VERSIONS = ((2, 5), (3,))
VERSION_FILE = "src/pytorch_metric_learning/__init__.py"
# the files the kit edits, and the anchor each edit needs in them
EDITED = {
    "src/pytorch_metric_learning/losses/__init__.py": "PML's 'from .<module> import <Class>' lines",
    "src/pytorch_metric_learning/losses/cross_batch_memory.py": "CrossBatchMemory.supported_losses()",
}


def checkout_layout(checkout):
    """``checkout`` as a Path, if it is a pytorch-metric-learning checkout of a version in
    PML_VERSIONS; a KitError naming what is missing or wrong otherwise."""
    checkout = Path(checkout)
    if not checkout.is_dir():
        raise KitError(f"{checkout} is not a folder: give the path of a pytorch-metric-learning checkout")
    needed = [VERSION_FILE, *EDITED, "tests/__init__.py"]
    missing = [p for p in needed if not (checkout / p).is_file()]
    if missing:
        raise KitError(f"{checkout} is not a pytorch-metric-learning checkout (missing {', '.join(missing)})")
    version = pml_version(checkout / VERSION_FILE)
    if not PML_VERSIONS[0] <= version < PML_VERSIONS[1]:
        low, high = (".".join(map(str, v)) for v in PML_VERSIONS)
        raise KitError(
            f"{checkout / VERSION_FILE}: pytorch-metric-learning {'.'.join(map(str, version))}, but the kit "
            f"writes for versions >= {low} and < {high}: check out a version in that range"
        )
    return checkout


def pml_version(path):
    """(major, minor, ...) of the ``__version__ = "..."`` that PML's package sets."""
    tree = python_file(path, "PML's package with its __version__")
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["__version__"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            match = re.match(r"\d+(\.\d+)*", node.value.value)
            if match:
                return tuple(int(part) for part in match.group(0).split("."))
    raise KitError(f'{path}: expected a line __version__ = "<major>.<minor>...", as PML\'s package has')


def read(path):
    """The text of ``path``, a file of the checkout; a FileFault or KitError names it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise file_fault(error, path, "reading") from error
    except UnicodeDecodeError:
        raise KitError(f"{path} is not UTF-8 text: expected PML's file") from None


def python_file(path, expected):
    """The syntax tree of ``path``; a KitError naming it and ``expected`` if it does not parse."""
    try:
        return ast.parse(read(path))
    except SyntaxError as error:
        raise KitError(f"{path}: not valid Python (line {error.lineno}): expected {expected}") from None


def edit(path, function, *args):
    """``function(text of path, *args)``, the new text of ``path``; a missing anchor is a
    KitError naming the file."""
    text = read(path)
    if path.suffix == ".py":
        python_file(path, "PML's file")
    try:
        return function(text, *args)
    except KitError as error:
        raise KitError(f"{path}: {error}; the file differs from PML's: restore it (git checkout)") from None


def our_extra_supported_losses():
    """The losses our CrossBatchMemory accepts beyond PML's (through its supported_losses())."""
    from pytorch_metric_learning.losses import CrossBatchMemory

    import pml_fieldlosses.losses as ours

    names = set()
    for value in vars(ours).values():
        if isinstance(value, type) and issubclass(value, CrossBatchMemory) and value is not CrossBatchMemory:
            names |= set(value.supported_losses()) - set(CrossBatchMemory.supported_losses())
    return sorted(names)


def plan(checkout, tests_dir=None, docs=None):
    """Every file the kit writes into ``checkout``, computed before anything is written:
    {path: (status, new text)}, status 'new', 'edited' or 'unchanged', in the order of
    writing. It only reads: a KitError or FileFault here leaves the checkout as it was."""
    tests_dir = Path(tests_dir or REPO / "tests")
    docs = Path(docs or REPO / "docs" / "losses.md")
    if not (tests_dir / "naive.py").is_file() or not docs.is_file():
        raise KitError(
            "the kit runs from a source checkout of pml-fieldlosses "
            "(it reads tests/losses/, tests/naive*.py and docs/)"
        )
    try:
        modules = sources.closure()  # first: a loss declared without its module stops the kit anyway
        checkout = checkout_layout(checkout)
        for relative, expected in EDITED.items():
            python_file(checkout / relative, f"PML's file with {expected}")
        texts = contents(checkout, modules, tests_dir, docs)
    except OSError as error:
        raise file_fault(error, error.filename or checkout, "reading") from error
    files = {}
    for path, text in texts.items():
        old = read(path) if os.path.lexists(path) else None
        files[path] = ("new" if old is None else ("edited" if old != text else "unchanged"), text)
    return files


def contents(checkout, modules, tests_dir, docs):
    """{path in the checkout: its text after the kit}, in the order of writing; ``modules``:
    our modules it writes (sources.closure())."""
    transformed = {m: sources.transform(m, checkout) for m in modules}
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

    texts = {}
    for module, text in transformed.items():
        texts[sources.target_path(checkout, module)] = text
    for package, text in sources.new_packages(modules, checkout).items():
        texts[sources.target_path(checkout, package).with_suffix("") / "__init__.py"] = text
    init = checkout / "src/pytorch_metric_learning/losses/__init__.py"
    texts[init] = edit(init, edits.add_exports, exports)
    extra = our_extra_supported_losses()
    cbm = checkout / "src/pytorch_metric_learning/losses/cross_batch_memory.py"
    texts[cbm] = edit(cbm, edits.add_supported_losses, extra)
    for test in sorted((checkout / "tests").rglob("test_*.py")):
        if "CrossBatchMemory.supported_losses()" in read(test):
            texts[test] = edit(test, edits.add_to_loss_lists, extra)
    for relative, text in test_files.items():
        texts[checkout / "tests" / relative] = text
    pml_docs = checkout / "docs/losses.md"
    if pml_docs.is_file():
        texts[pml_docs] = edit(pml_docs, edits.add_doc_sections, sections)
    return texts


def write(checkout, files):
    """Write what ``plan`` computed, all or nothing (writer.write_all); returns {path
    relative to the checkout: 'new' | 'edited' | 'unchanged'}."""
    writer.write_all({path: text for path, (status, text) in files.items() if status != "unchanged"})
    return {str(path.relative_to(checkout)): status for path, (status, _) in files.items()}


def apply(checkout, tests_dir=None, docs=None):
    """Write the kit into ``checkout``, all or nothing; returns {path relative to the
    checkout: 'new' | 'edited' | 'unchanged'}."""
    return write(Path(checkout), plan(checkout, tests_dir, docs))


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
            "the gradient flows back to the half-precision embeddings in their dtype (inf where it "
            "overflows float16, so that a GradScaler sees it). PML's own losses instead follow the "
            "input dtype; tell us if you prefer that.",
            "* Helpers: input checks (`utils/checks.py`), grouped log-sum-exp and normalisation helpers "
            "(`utils/loss_utils.py`), the potential losses' machinery "
            "(`losses/potential/`: the energy, the candidate searches, the pair searches and the "
            "neighbour list), and `losses/checked_forward_mixin.py` (the checks and the precision "
            "policy above, shared by the five losses).",
            "* Formatting: our line length is 110; run `format_code.sh` (black/isort) before merging.",
        ]
    )


def existing_folder(text):
    """An argparse type: the path of an existing folder."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} {'is not a folder' if path.exists() else 'does not exist'}: "
            "expected the path of a pytorch-metric-learning checkout"
        )
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pml_fieldlosses.app.upstream",
        description="Write our losses, their tests and docs into a pytorch-metric-learning checkout "
        "and print a pull-request description. All or nothing: on any error the checkout is left as it was.",
    )
    parser.add_argument(
        "checkout",
        type=existing_folder,
        help="path of a pytorch-metric-learning checkout (with src/ and tests/)",
    )
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    args = parser.parse_args(argv)
    try:
        files = plan(args.checkout)
    except (KitError, FileFault) as error:
        fail(args, error, f"upstream kit: {error}; nothing was written")
    except KeyboardInterrupt:
        fail(args, None, "upstream kit: interrupted; nothing was written", 130)
    try:
        written = write(args.checkout, files)
    except FileFault as error:  # its line says whether the checkout is unchanged
        fail(args, error, f"upstream kit: {error}")
    except KeyboardInterrupt:
        fail(args, None, f"upstream kit: interrupted; {writer.UNCHANGED}", 130)
    if set(written.values()) == {"unchanged"}:
        print(
            f"upstream kit: {args.checkout} already has every file of the kit: nothing written",
            file=sys.stderr,
        )
    print(pr_description(written))


def fail(args, error, line, status=1):
    """Print ``line`` and exit with ``status``, or re-raise ``error`` under --traceback."""
    if args.traceback and error is not None:
        raise error
    print(line, file=sys.stderr)
    raise SystemExit(status)

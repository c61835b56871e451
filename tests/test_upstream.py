"""The upstream kit (python -m pml_fieldlosses.app.upstream), without network: applied to a
copy of the installed pytorch_metric_learning laid out like a checkout, whose generated
unittest files then run against the patched copy in a process where pml_fieldlosses
cannot be imported. docs/upstream.md has the run against a real PML checkout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_metric_learning

from pml_fieldlosses.app.upstream import edits, kit, sources

# PML's tests/__init__.py is not in the wheel; its contract for the test modules, as in
# PML: TEST_DTYPES and TEST_DEVICE from the environment, src/ first on the path
TESTS_INIT = """import os
import sys

import torch

sys.path.insert(0, "src")
TEST_DTYPES = [getattr(torch, x) for x in os.environ.get("TEST_DTYPES", "float32,float64").split(",")]
TEST_DEVICE = torch.device(os.environ.get("TEST_DEVICE", "cpu"))
"""
# runs unittest with pml_fieldlosses made unimportable
BLOCKED_UNITTEST = (
    "import sys; sys.modules['pml_fieldlosses'] = None; import unittest; "
    "import pytorch_metric_learning as p; print('PML from', p.__file__, file=sys.stderr); "
    "unittest.main(module=None, argv=['unittest'] + sys.argv[1:])"
)
LOSSES = [n for m in sources.LOSS_MODULES for n in sources.exported_classes(m)]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("pml_checkout")
    shutil.copytree(Path(pytorch_metric_learning.__file__).parent, root / "src" / "pytorch_metric_learning",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests" / "losses").mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text(TESTS_INIT)
    (root / "tests" / "losses" / "__init__.py").write_text("")
    result = subprocess.run([sys.executable, "-m", "pml_fieldlosses.app.upstream", str(root)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return root, result.stdout


def test_kit_writes_one_module_and_one_test_per_loss(checkout):
    root, description = checkout
    assert len(LOSSES) == 5 and "RelationalLoss" not in LOSSES
    losses_dir = root / "src/pytorch_metric_learning/losses"
    for module in sources.LOSS_MODULES:
        name = module.rsplit(".", 1)[1]
        assert (losses_dir / f"{name}.py").is_file()
        assert (root / "tests/losses" / f"test_{name}.py").is_file()
    init = (losses_dir / "__init__.py").read_text()
    lines = [line for line in init.splitlines() if line.startswith("from .")]
    assert lines == sorted(lines, key=lambda line: line.split()[1]), "PML's alphabetical order"
    for name in LOSSES:
        assert f" {name}" in init
    assert "ClassWiseMultiSimilarityLoss" in (losses_dir / "cross_batch_memory.py").read_text()
    # every package the new modules sit in is a regular package (a wheel's find_packages needs it)
    for path in (root / "src").rglob("*.py"):
        assert (path.parent / "__init__.py").is_file(), path
    assert "torch >= 2.0" in description and "float32 under autocast" in description


def test_patched_pml_never_mentions_us(checkout):
    root, _ = checkout
    for path in list((root / "src").rglob("*.py")) + list((root / "tests").rglob("*.py")):
        assert "pml_fieldlosses" not in path.read_text(), path


def test_generated_unittests_pass_against_the_patched_copy(checkout):
    root, _ = checkout
    env = dict(os.environ, TEST_DTYPES="float32,float64", TEST_DEVICE="cpu", PYTHONPATH=str(root / "src"))
    result = subprocess.run([sys.executable, "-c", BLOCKED_UNITTEST, "discover", "-t", ".", "-s", "tests/losses"],
                            cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"PML from {root / 'src'}" in result.stderr
    assert f"Ran {len(LOSSES)} tests" in result.stderr and "\nOK" in result.stderr


def test_generated_unittest_fails_on_a_wrong_loss(checkout, tmp_path):
    """The generated tests can fail: with a wrong margin in the reference, the value differs."""
    root, _ = checkout
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    test = copy / "tests/losses/test_mean_field_contrastive_loss.py"
    reference = "mean_field_contrastive(x, y, W, 0.1, 0.9, 0.5, 2)"
    assert reference in test.read_text()
    test.write_text(test.read_text().replace(reference, reference.replace("0.9", "0.8")))
    env = dict(os.environ, TEST_DTYPES="float64", TEST_DEVICE="cpu", PYTHONPATH=str(copy / "src"))
    result = subprocess.run([sys.executable, "-c", BLOCKED_UNITTEST, "tests.losses.test_mean_field_contrastive_loss"],
                            cwd=copy, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "FAILED" in result.stderr


def test_kit_is_idempotent(checkout):
    root, _ = checkout
    before = {p: p.read_text() for p in root.rglob("*.py")}
    from pml_fieldlosses.app.upstream import apply

    assert set(apply(root).values()) == {"unchanged"}
    assert {p: p.read_text() for p in root.rglob("*.py")} == before


def test_edits_of_pml_files():
    init = "from .angular_loss import AngularLoss\nfrom .margin_loss import MarginLoss\n"
    edited = edits.add_exports(init, {"contrastive_potential_loss": ["ContrastivePotentialLoss"]})
    assert edited.splitlines()[1] == "from .contrastive_potential_loss import ContrastivePotentialLoss"
    assert edits.add_exports(edited, {"contrastive_potential_loss": ["ContrastivePotentialLoss"]}) == edited

    cbm = 'class C:\n    def supported_losses():\n        return [\n            "AngularLoss",\n            "SupConLoss",\n        ]\n'
    edited = edits.add_supported_losses(cbm, ["ClassWiseMultiSimilarityLoss"])
    assert '            "ClassWiseMultiSimilarityLoss",\n            "SupConLoss",' in edited
    assert edits.add_supported_losses(edited, ["ClassWiseMultiSimilarityLoss"]) == edited

    test = ("def load(self):\n    supported_losses = CrossBatchMemory.supported_losses()\n    loss_fns = [\n"
            "        losses.AngularLoss(),\n        losses.SupConLoss(),\n    ]\n")
    edited = edits.add_to_loss_lists(test, ["ClassWiseMultiSimilarityLoss"])
    assert "        losses.ClassWiseMultiSimilarityLoss(),\n        losses.SupConLoss()," in edited
    assert edits.add_to_loss_lists(edited, ["ClassWiseMultiSimilarityLoss"]) == edited

    docs = "# Losses\n\n## AngularLoss\ntext\n\n## MarginLoss\ntext\n"
    ours = "## ClassWiseMultiSimilarityLoss\n\n**Parameters**\n\n**Default distance**: `CosineSimilarity()`.\n"
    section = edits.pml_doc_format(ours, "ClassWiseMultiSimilarityLoss")
    assert "**Parameters**:" in section and "](distances.md#cosinesimilarity)" in section
    edited = edits.add_doc_sections(docs, {"ClassWiseMultiSimilarityLoss": section})
    assert edited.index("## AngularLoss") < edited.index("## ClassWise") < edited.index("## MarginLoss")
    assert edits.add_doc_sections(edited, {"ClassWiseMultiSimilarityLoss": section}) == edited


def test_mentions_without_a_place_in_pml_are_refused():
    assert sources.map_mentions("see pml_fieldlosses.utils.checks.check_positive", "x") == (
        "see pytorch_metric_learning.utils.checks.check_positive")
    with pytest.raises(sources.KitError):
        sources.map_mentions("import pml_fieldlosses.app.bench", "x")


def test_our_docs_have_every_loss_in_pml_format():
    text = (sources.PACKAGE_DIR.parent / "docs" / "losses.md").read_text()
    for name, section in edits.doc_sections(text, LOSSES).items():
        section = edits.pml_doc_format(section, name, edits.defaults_from_code(*kit.loss_factory(name)))
        for heading in ("**Parameters**:", "**Default distance**", "**Default reducer**", "**Reducer input**:"):
            assert heading in section, (name, heading)

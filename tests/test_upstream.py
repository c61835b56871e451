"""The upstream kit (python -m pml_fieldlosses.app.upstream), without network: applied to a
copy of the installed pytorch_metric_learning laid out like a checkout, whose generated
unittest files then run against the patched copy in a process where pml_fieldlosses
cannot be imported. docs/upstream.md has the run against a real PML checkout.

The kit is all or nothing: a failure at any write (drawn by hypothesis), a read-only folder,
a checkout that is not PML's or of another version, an edited file without the anchor an
edit needs: one line naming the path, and the checkout byte-identical to before."""

import errno
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_metric_learning
from hypothesis import given, settings
from hypothesis import strategies as st

from pml_fieldlosses.app.errors import ADVICE, FileFault
from pml_fieldlosses.app.upstream import edits, kit, sources, writer
from pml_fieldlosses.app.upstream.sources import KitError

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


def make_checkout(root):
    """A copy of the installed pytorch_metric_learning laid out as a checkout."""
    shutil.copytree(
        Path(pytorch_metric_learning.__file__).parent,
        root / "src" / "pytorch_metric_learning",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (root / "tests" / "losses").mkdir(parents=True)
    (root / "tests" / "__init__.py").write_text(TESTS_INIT)
    (root / "tests" / "losses" / "__init__.py").write_text("")
    return root


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = make_checkout(tmp_path_factory.mktemp("pml_checkout"))
    result = subprocess.run(
        [sys.executable, "-m", "pml_fieldlosses.app.upstream", str(root)], capture_output=True, text=True
    )
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
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_UNITTEST, "discover", "-t", ".", "-s", "tests/losses"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
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
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_UNITTEST, "tests.losses.test_mean_field_contrastive_loss"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
    )
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

    test = (
        "def load(self):\n    supported_losses = CrossBatchMemory.supported_losses()\n    loss_fns = [\n"
        "        losses.AngularLoss(),\n        losses.SupConLoss(),\n    ]\n"
    )
    edited = edits.add_to_loss_lists(test, ["ClassWiseMultiSimilarityLoss"])
    assert "        losses.ClassWiseMultiSimilarityLoss(),\n        losses.SupConLoss()," in edited
    assert edits.add_to_loss_lists(edited, ["ClassWiseMultiSimilarityLoss"]) == edited

    docs = "# Losses\n\n## AngularLoss\ntext\n\n## MarginLoss\ntext\n"
    ours = (
        "## ClassWiseMultiSimilarityLoss\n\n**Parameters**\n\n**Default distance**: `CosineSimilarity()`.\n"
    )
    section = edits.pml_doc_format(ours, "ClassWiseMultiSimilarityLoss")
    assert "**Parameters**:" in section and "](distances.md#cosinesimilarity)" in section
    edited = edits.add_doc_sections(docs, {"ClassWiseMultiSimilarityLoss": section})
    assert edited.index("## AngularLoss") < edited.index("## ClassWise") < edited.index("## MarginLoss")
    assert edits.add_doc_sections(edited, {"ClassWiseMultiSimilarityLoss": section}) == edited


def test_mentions_without_a_place_in_pml_are_refused():
    assert sources.map_mentions("see pml_fieldlosses.utils.checks.check_positive", "x") == (
        "see pytorch_metric_learning.utils.checks.check_positive"
    )
    with pytest.raises(sources.KitError):
        sources.map_mentions("import pml_fieldlosses.app.bench", "x")


def test_our_docs_have_every_loss_in_pml_format():
    text = (sources.PACKAGE_DIR.parent / "docs" / "losses.md").read_text()
    for name, section in edits.doc_sections(text, LOSSES).items():
        section = edits.pml_doc_format(section, name, edits.defaults_from_code(*kit.loss_factory(name)))
        for heading in (
            "**Parameters**:",
            "**Default distance**",
            "**Default reducer**",
            "**Reducer input**:",
        ):
            assert heading in section, (name, heading)


# ----------------------------------------------------------------------------- all or nothing

CBM_TEST = """from pytorch_metric_learning import losses
from pytorch_metric_learning.losses import CrossBatchMemory


def test_supported():
    supported_losses = CrossBatchMemory.supported_losses()
    loss_fns = [
        losses.AngularLoss(),
        losses.SupConLoss(),
    ]
"""
PML_DOCS = "# Losses\n\n## AngularLoss\ntext\n\n## MarginLoss\ntext\n"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """An unpatched checkout with every file the kit edits (never written to: tests copy it)."""
    root = make_checkout(tmp_path_factory.mktemp("pristine"))
    (root / "tests/losses/test_cross_batch_memory.py").write_text(CBM_TEST)
    (root / "docs").mkdir()
    (root / "docs/losses.md").write_text(PML_DOCS)
    return root


@pytest.fixture(scope="module")
def planned(pristine):
    """{path relative to the checkout: text} of what the kit writes into ``pristine``."""
    files = kit.plan(pristine)
    assert {status for status, _ in files.values()} == {"new", "edited"}
    return {path.relative_to(pristine): text for path, (status, text) in files.items()}


def fresh(pristine, tmp_path_factory):
    return shutil.copytree(pristine, tmp_path_factory.mktemp("copy") / "pml")


def snapshot(root):
    """{path: (sha256 or 'folder', mode)} of everything under ``root``, hidden files too."""
    return {
        str(p.relative_to(root)): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder",
            p.stat().st_mode,
        )
        for p in root.rglob("*")
    }


class FaultyOs:
    """The os module as the kit's writer sees it: its k-th write (os.mkdir, os.open,
    os.write, os.replace) raises ``error`` (k None: none does; ``count`` counts them).
    ``denied``: paths os.access says cannot be written (as for a user who is not root).
    ``undo_fails``: after the fault, os.unlink and os.rmdir fail too."""

    WRITES = ("mkdir", "open", "write", "replace")

    def __init__(self, k=None, error=None, denied=(), undo_fails=False):
        self.k, self.error, self.denied, self.undo_fails = k, error, [Path(p) for p in denied], undo_fails
        self.count = 0

    def access(self, path, mode):
        return Path(path) not in self.denied and os.access(path, mode)

    def __getattr__(self, name):
        function = getattr(os, name)
        if name in ("unlink", "rmdir") and self.undo_fails:
            return self.after_fault(function)
        if name not in self.WRITES:
            return function

        def counted(*args, **kwargs):
            self.count += 1
            if self.count == self.k:
                raise self.error
            return function(*args, **kwargs)

        return counted

    def after_fault(self, function):
        def failing(*args, **kwargs):
            if self.k is not None and self.count >= self.k:
                raise OSError(errno.EACCES, os.strerror(errno.EACCES))
            return function(*args, **kwargs)

        return failing


def write_all(root, planned, faulty):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer, "os", faulty)
        writer.write_all({root / relative: text for relative, text in planned.items()})


def one_line_naming(message, path):
    assert "\n" not in message and "Traceback" not in message, message
    assert str(path) in message, (path, message)


@pytest.fixture(scope="module")
def writes(pristine, planned, tmp_path_factory):
    """How many writes the kit's writer makes (and that, unhindered, it writes the plan)."""
    root = fresh(pristine, tmp_path_factory)
    counter = FaultyOs()
    write_all(root, planned, counter)
    for relative, text in planned.items():
        assert (root / relative).read_text() == text
    assert not [p for p in root.rglob(".*upstream-kit*")], "no temporary file is left"
    assert counter.count > 2 * len(planned)
    return counter.count


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_failure_at_any_write_leaves_the_checkout_byte_identical(
    pristine, planned, writes, tmp_path_factory, data
):
    k = data.draw(st.integers(1, writes), label="k (the write that fails)")
    number = data.draw(st.sampled_from([errno.ENOSPC, errno.EROFS, errno.EACCES, None]), label="errno")
    error = KeyboardInterrupt() if number is None else OSError(number, os.strerror(number))
    root = fresh(pristine, tmp_path_factory)
    before = snapshot(root)
    with pytest.raises(KeyboardInterrupt if number is None else FileFault) as caught:
        write_all(root, planned, FaultyOs(k, error))
    assert snapshot(root) == before
    if number is not None:
        one_line_naming(str(caught.value), root)
        assert ADVICE[number] in str(caught.value) and str(caught.value).endswith("the checkout is unchanged")


def test_a_failed_undo_is_named(pristine, planned, writes, tmp_path_factory):
    root = fresh(pristine, tmp_path_factory)
    error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(FileFault) as caught:
        write_all(root, planned, FaultyOs(writes, error, undo_fails=True))  # the last replace
    one_line_naming(str(caught.value), root)
    assert "could not undo" in str(caught.value) and "unchanged" not in str(caught.value)


OBSTACLES = {  # what is in the way -> (the path named, errno of the advice)
    "read-only folder": ("tests/losses", errno.EACCES),
    "read-only file": ("src/pytorch_metric_learning/losses/cross_batch_memory.py", errno.EACCES),
    "file where a folder goes": ("src/pytorch_metric_learning/losses/potential", errno.ENOTDIR),
    "folder where a file goes": ("tests/losses/test_potential_field_loss.py", errno.EISDIR),
}


@pytest.mark.parametrize("obstacle", OBSTACLES)
def test_what_cannot_be_written_is_refused_before_writing(pristine, planned, tmp_path_factory, obstacle):
    root = fresh(pristine, tmp_path_factory)
    relative, number = OBSTACLES[obstacle]
    denied = [root / relative] if "read-only" in obstacle else []
    if obstacle == "file where a folder goes":
        (root / relative).write_text("")
    if obstacle == "folder where a file goes":
        (root / relative).mkdir()
    before = snapshot(root)
    faulty = FaultyOs(denied=denied)
    with pytest.raises(FileFault) as caught:
        write_all(root, planned, faulty)
    assert faulty.count == 0, "refused before the first write"
    assert snapshot(root) == before
    one_line_naming(str(caught.value), root / relative)
    assert ADVICE[number] in str(caught.value)


def run_main(argv, capsys):
    """(exit status, stderr) of the kit's command."""
    try:
        kit.main([str(a) for a in argv])
        status = 0
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes in read-only folders"
)
def test_a_read_only_checkout_is_refused_in_one_line(pristine, tmp_path_factory, capsys):
    root = fresh(pristine, tmp_path_factory)
    folder = root / "tests/losses"
    folder.chmod(0o555)
    try:
        before = snapshot(root)
        status, err = run_main([root], capsys)
    finally:
        folder.chmod(0o755)
    assert status == 1 and snapshot(root) == before
    one_line_naming(err.strip(), folder)


def test_a_read_only_tests_folder_met_while_writing(pristine, planned, tmp_path_factory, capsys, monkeypatch):
    """The instance that left a half-patched PML: src/ writable, tests/ on a read-only mount
    (as root, who passes the permission checks): the writes into src/ are undone."""
    root = fresh(pristine, tmp_path_factory)
    before = snapshot(root)

    class ReadOnlyTests(FaultyOs):
        def __getattr__(self, name):
            function = getattr(os, name)
            if name not in ("open", "mkdir"):
                return function

            def refused(path, *args, **kwargs):
                if Path(path).is_relative_to(root / "tests"):
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
                return function(path, *args, **kwargs)

            return refused

    monkeypatch.setattr(writer, "os", ReadOnlyTests())
    status, err = run_main([root], capsys)
    assert status == 1 and snapshot(root) == before
    one_line_naming(err.strip(), root / "tests")
    assert ADVICE[errno.EROFS] in err and "the checkout is unchanged" in err


def test_a_full_disk_ends_the_command_in_one_line(pristine, writes, tmp_path_factory, capsys, monkeypatch):
    root = fresh(pristine, tmp_path_factory)
    before = snapshot(root)
    monkeypatch.setattr(writer, "os", FaultyOs(writes // 2, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    status, err = run_main([root], capsys)
    assert status == 1 and snapshot(root) == before
    assert err.startswith("upstream kit: writing ") and ADVICE[errno.ENOSPC] in err
    one_line_naming(err.strip(), root)


INIT = "src/pytorch_metric_learning/losses/__init__.py"
CBM = "src/pytorch_metric_learning/losses/cross_batch_memory.py"
CBM_TESTS = "tests/losses/test_cross_batch_memory.py"
EDITS = {  # the files the kit edits -> (the edit, its argument)
    INIT: (edits.add_exports, {"potential_field_loss": ["PotentialFieldLoss"]}),
    CBM: (edits.add_supported_losses, ["ClassWiseMultiSimilarityLoss"]),
    CBM_TESTS: (edits.add_to_loss_lists, ["ClassWiseMultiSimilarityLoss"]),
    "docs/losses.md": (edits.add_doc_sections, {"PotentialFieldLoss": "## PotentialFieldLoss\n"}),
}
BROKEN = [  # (file, its text made from PML's without the anchor, the words of what was expected)
    (INIT, lambda text: "__all__ = []\n", "'from .<module> import <Class>' lines"),
    (CBM, lambda text: text.replace("def supported_losses", "def supported"), "def supported_losses()"),
    (CBM, lambda text: re.sub(r"return \[[^\]]*\]", "return []", text), "def supported_losses()"),
    (CBM, lambda text: re.sub(r'"AngularLoss"', "AngularLoss", text), "def supported_losses()"),
    (
        CBM_TESTS,
        lambda text: re.sub(r"loss_fns = \[[^\]]*\]", "loss_fns = []", text),
        "list of loss instances",
    ),
    (
        CBM_TESTS,
        lambda text: "def test_supported():\n    CrossBatchMemory.supported_losses()\n",
        "list of loss instances",
    ),
    ("docs/losses.md", lambda text: "# Losses\n\nNo sections.\n", "'## <Loss>' sections"),
    *[(f, lambda text: "def broken(:\n", "not valid Python (line 1)") for f in (INIT, CBM, CBM_TESTS)],
    *[(f, lambda text: b"\xff\xfe not text", "is not UTF-8 text") for f in EDITS],
]


@pytest.mark.parametrize("relative, change, expected", BROKEN)
def test_an_edited_file_without_its_anchor_is_named(pristine, tmp_path_factory, relative, change, expected):
    root = fresh(pristine, tmp_path_factory)
    path = root / relative
    function, argument = EDITS[relative]
    assert kit.edit(path, function, argument) != path.read_text(), "the pristine file has its anchor"
    text = change(path.read_text())
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(KitError) as caught:
        kit.edit(path, function, argument)
    one_line_naming(str(caught.value), path)
    assert expected in str(caught.value)


def test_a_missing_anchor_ends_the_command_in_one_line(pristine, tmp_path_factory, capsys):
    root = fresh(pristine, tmp_path_factory)
    cbm = root / "src/pytorch_metric_learning/losses/cross_batch_memory.py"
    cbm.write_text(cbm.read_text().replace("def supported_losses", "def supported"))
    before = snapshot(root)
    status, err = run_main([root], capsys)
    assert status == 1 and snapshot(root) == before
    one_line_naming(err.strip(), cbm)
    assert "def supported_losses()" in err and err.strip().endswith("nothing was written")


@pytest.mark.parametrize(
    "version, accepted",
    [
        ("2.5.0", True),
        ("2.8.1", True),
        ("2.9.0.dev0", True),
        ("2.4.9", False),
        ("1.7.3", False),
        ("3.0.0", False),
        (None, False),
        ("not a version", False),
    ],
)
def test_only_the_pml_versions_the_kit_writes_for_are_taken(pristine, tmp_path_factory, version, accepted):
    root = fresh(pristine, tmp_path_factory)
    init = root / kit.VERSION_FILE
    lines = [line for line in init.read_text().splitlines() if not line.startswith("__version__")]
    if version is not None:
        lines.append(f'__version__ = "{version}"')
    init.write_text("\n".join(lines) + "\n")
    if accepted:
        assert kit.checkout_layout(root) == root
        return
    with pytest.raises(KitError) as caught:
        kit.checkout_layout(root)
    one_line_naming(str(caught.value), init)
    assert ">= 2.5 and < 3" in str(caught.value) or "__version__" in str(caught.value)


def test_the_kit_writes_for_the_pml_versions_we_depend_on():
    low, high = (".".join(map(str, v)) for v in kit.PML_VERSIONS)
    pyproject = (sources.PACKAGE_DIR.parent / "pyproject.toml").read_text()
    assert f'"pytorch-metric-learning>={low},<{high}"' in pyproject


def test_what_is_not_a_pml_checkout_is_named(pristine, tmp_path_factory):
    root = fresh(pristine, tmp_path_factory)
    (root / "src/pytorch_metric_learning/losses/cross_batch_memory.py").unlink()
    for path in (root, root / "src", root / "absent"):
        with pytest.raises(KitError) as caught:
            kit.checkout_layout(path)
        one_line_naming(str(caught.value), path)
    assert "cross_batch_memory.py" in str(kit_error(kit.checkout_layout, root))


def kit_error(function, *args):
    with pytest.raises(KitError) as caught:
        function(*args)
    return caught.value


@pytest.mark.parametrize(
    "argv", [[], ["{tmp}/absent"], ["{tmp}/file"], ["{tmp}", "--bogus"], ["{tmp}", "{tmp}"]]
)
def test_bad_command_lines_exit_2_in_one_line(tmp_path, capsys, argv):
    (tmp_path / "file").write_text("")
    status, err = run_main([a.format(tmp=tmp_path) for a in argv], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 2 and err.startswith("usage:")  # argparse: usage, then the error
    assert "error:" in err.splitlines()[1]


def test_a_patched_checkout_is_left_as_it_is(checkout, capsys):
    """Running the kit again is a no-op that says so (and prints the same PR description)."""
    root, _ = checkout
    before = snapshot(root)
    status, err = run_main([root], capsys)
    assert status == 0 and snapshot(root) == before
    assert "already has every file of the kit: nothing written" in err

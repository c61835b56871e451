"""Packaging: the extras of pyproject.toml, the console-script guards, and a core-only
install (our wheel, torch, pytorch-metric-learning and numpy, nothing else) in a fresh
venv that imports and runs every loss, the DRML head and the DDP wrapper, finds the pb
config root, and whose console scripts name the pip command of their missing extra."""

import ast
import email
import json
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from pml_fieldlosses.app import entry_points, extras

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CORE = {"torch", "pytorch-metric-learning", "numpy"}
# packages of the extras that a core install must not bring in
NOT_IN_CORE = ("cairosvg", "matplotlib", "faiss", "efficientnet", "tensorboard", "record-keeper",
               "powerful-benchmarker", "ray", "torchvision", "pillow", "platformdirs", "ax-platform")
# PML 2.x's own requirements (its common_functions imports scipy and tqdm): a core
# install has them because PML does, not because we ask for them
PML_OWN = {"scikit-learn", "scipy", "tqdm"}
# a torch that installs quickly (a CPU wheel); any torch >= 2.1 would do
CORE_TORCH = "torch==2.13.0"
# every class our losses module exports, and how the core-only check runs it
OUR_LOSSES = {
    "MeanFieldContrastiveLoss", "ClassWiseMultiSimilarityLoss", "MeanFieldClassWiseMultiSimilarityLoss",
    "PotentialFieldLoss", "ContrastivePotentialLoss", "RelationalLoss",
}


def requirement_name(requirement):
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower()


def test_core_dependencies_are_the_losses_only():
    deps = PYPROJECT["project"]["dependencies"]
    assert {requirement_name(d) for d in deps} == CORE
    torch_req = next(d for d in deps if requirement_name(d) == "torch")
    assert "==" not in torch_req and ">=" in torch_req, "torch is a range (>= floor), never a pin"


def test_extras_match_the_guards_table():
    """Every distribution of every extra has its module in extras.EXTRAS (what the
    console-script guards look up), and nothing else is there."""
    declared = PYPROJECT["project"]["optional-dependencies"]
    assert set(declared) == set(extras.EXTRAS)
    for name, requirements in declared.items():
        assert {requirement_name(r) for r in requirements} == set(extras.EXTRAS[name]), name


def test_faiss_flavours_are_exclusive():
    """faiss-cpu and faiss-gpu install the same module: no extra pulls both, and only the
    flavour extras pull either."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name, requirements in extras.items():
        faiss = {requirement_name(r) for r in requirements if requirement_name(r).startswith("faiss")}
        assert len(faiss) <= 1, name
        assert not faiss or name.startswith("faiss-"), f"{name} pulls {faiss}: use a flavour extra"


def test_scripts_go_through_the_guards():
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {
        "pml-fieldlosses": "pml_fieldlosses.app.entry_points:bench_main",
        "pml-fieldlosses-pb": "pml_fieldlosses.app.entry_points:pb_main",
    }


def test_license():
    project = PYPROJECT["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    # SPDX license + license-files need setuptools >= 77
    requires = PYPROJECT["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(\d+).*", r) and int(re.match(r"setuptools>=(\d+)", r)[1]) >= 77
               for r in requires)


def test_guard_message_is_one_line(monkeypatch):
    """A missing module of the extra: SystemExit with one line naming the pip command;
    a present one: no exit."""
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("cairosvg", "faiss") else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        extras.require("pml-fieldlosses", ["bench", "faiss-cpu"])
    message = str(exc.value.code)
    assert "\n" not in message
    assert 'pip install "pml-fieldlosses[bench,faiss-cpu]"' in message and "cairosvg, faiss" in message
    monkeypatch.setattr(extras.importlib.util, "find_spec", real)
    extras.require("pml-fieldlosses", ["test"])  # pytest, hypothesis and import-linter are here


def test_guard_does_not_hide_our_import_errors(monkeypatch):
    """The guard looks the extra's packages up; an ImportError of our own code goes through."""
    monkeypatch.setattr(entry_points, "require", lambda *a, **k: None)
    monkeypatch.setitem(sys.modules, "pml_fieldlosses.app.cli", None)  # import raises ImportError
    with pytest.raises(ImportError):
        entry_points.bench_main()


# ---------------------------------------------------------------- the core-only venv

CORE_SCRIPT = r"""
import importlib.util, json, sys, warnings, torch
warnings.simplefilter('ignore')
import pml_fieldlosses
from pml_fieldlosses import losses, models
from pml_fieldlosses.utils.distributed import DistributedLossWrapper
from pytorch_metric_learning.losses import BaseMetricLossFunction, MultiSimilarityLoss

ours = sorted(n for n in dir(losses) if isinstance(getattr(losses, n), type)
              and issubclass(getattr(losses, n), BaseMetricLossFunction)
              and getattr(losses, n).__module__.startswith("pml_fieldlosses")
              and not n.startswith("Base") and n != "CrossBatchMemory" and "CrossBatch" not in n)
torch.manual_seed(0)
C, D, B = 5, 8, 12
labels = torch.randint(0, C, (B,))
built = {
    "MeanFieldContrastiveLoss": losses.MeanFieldContrastiveLoss(C, D),
    "ClassWiseMultiSimilarityLoss": losses.ClassWiseMultiSimilarityLoss(),
    "MeanFieldClassWiseMultiSimilarityLoss": losses.MeanFieldClassWiseMultiSimilarityLoss(C, D),
    "PotentialFieldLoss": losses.PotentialFieldLoss(C, D),
    "ContrastivePotentialLoss": losses.ContrastivePotentialLoss(C, D),
}
ran = {}
for name, loss_func in built.items():
    x = torch.randn(B, D, requires_grad=True)
    loss = DistributedLossWrapper(loss_func)(x, labels)
    loss.backward()
    ran[name] = bool(torch.isfinite(loss) and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0)
head = models.RelationalEmbedder(16, D, num_branches=2)
features = torch.randn(B, 16)
loss = losses.RelationalLoss(MultiSimilarityLoss(), num_branches=2, embedding_size=D)(head(features), labels)
loss.backward()
ran["RelationalLoss"] = bool(torch.isfinite(loss)) and all(
    p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters())
print(json.dumps({"ours": ours, "ran": ran,
                  "absent": [m for m in ("faiss", "matplotlib", "cairosvg", "tensorboard")
                             if importlib.util.find_spec(m) is None]}))
"""


def run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory):
    """A fresh venv with torch and then a plain ``pip install`` of our wheel (its core
    requirements, torch, PML and numpy, and theirs)."""
    tmp = tmp_path_factory.mktemp("core")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("pml_fieldlosses", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)])
    wheel = next(dist.glob("pml_fieldlosses-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile"]
    run(pip + [CORE_TORCH])
    with zipfile.ZipFile(wheel) as z:
        metadata = email.message_from_bytes(z.read(next(n for n in z.namelist() if n.endswith("METADATA"))))
    core = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert {requirement_name(r) for r in core} == CORE
    # a plain install, as a user's: our core requirements and theirs
    run(pip + [str(wheel)])
    return env_dir


def test_core_install_has_no_extra_packages(core_venv):
    listed = json.loads(run([str(core_venv / "bin" / "python"), "-m", "pip", "list", "--format=json"]).stdout)
    names = {p["name"].lower() for p in listed}
    assert CORE | {"pml-fieldlosses"} <= names
    assert not [n for n in names if n.startswith(NOT_IN_CORE)]
    show = run([str(core_venv / "bin" / "python"), "-m", "pip", "show", "pytorch-metric-learning"]).stdout
    pml_requires = {r.strip().lower() for r in re.search(r"^Requires: (.*)$", show, re.M)[1].split(",")}
    for name in PML_OWN & names:
        assert name in pml_requires or name == "scipy" and "scikit-learn" in pml_requires, name


def test_core_install_runs_every_loss_head_and_wrapper(core_venv):
    out = run([str(core_venv / "bin" / "python"), "-c", CORE_SCRIPT], cwd=core_venv).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert set(report["ours"]) == OUR_LOSSES, "a new loss: add it to CORE_SCRIPT"
    assert report["ran"] == {name: True for name in OUR_LOSSES}
    assert report["absent"] == ["faiss", "matplotlib", "cairosvg", "tensorboard"]


@pytest.mark.parametrize("script,extra", [("pml-fieldlosses", "bench"), ("pml-fieldlosses-pb", "pb")])
def test_core_install_scripts_name_the_missing_extra(core_venv, script, extra):
    result = subprocess.run([str(core_venv / "bin" / script), "bench", "--help"], capture_output=True,
                            text=True, cwd=core_venv)
    assert result.returncode != 0
    output = (result.stdout + result.stderr).strip()
    assert len(output.splitlines()) == 1 and "Traceback" not in output, output
    assert f'pip install "pml-fieldlosses[{extra},faiss-cpu]"' in output


def test_core_install_finds_the_pb_config_root(core_venv):
    """The wheel puts configs/ under share/; the launcher's own lookup
    (launcher.default_config_root, run alone: importing the launcher needs pb) finds it
    in the installed wheel, not in a checkout."""
    python = str(core_venv / "bin" / "python")
    package = run([python, "-c", "import pml_fieldlosses; print(pml_fieldlosses.__path__[0])"], cwd=core_venv)
    launcher = Path(package.stdout.strip()) / "app" / "benchmarker" / "launcher.py"
    tree = ast.parse(launcher.read_text())
    keep = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name == "default_config_root")
            or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets))]
    source = "import importlib.metadata\nfrom pathlib import Path\n" + "\n".join(ast.unparse(n) for n in keep)
    code = f"ns = {{'__file__': {str(launcher)!r}}}\nexec({source!r}, ns)\nprint(ns['default_config_root']())"
    root = Path(run([python, "-c", code], cwd=core_venv).stdout.strip())
    assert (root / "config_foldernames.yaml").is_file()
    assert root.resolve().is_relative_to(core_venv.resolve()) and "share" in root.parts


def test_ci_runs_readme_test_command():
    """.ci/run runs README's test command, character for character; README has exactly
    two set-up commands (the main job, the tests), each installing the extras it needs."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two set-up commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)
    assert len(commands) == 2
    main_job, tests = commands
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
    assert '".[bench,faiss-cpu]"' in main_job and main_job.endswith("pml-fieldlosses bench")
    extras = re.search(r'pip install -e "\.\[([^\]]+)\]"', tests)[1].split(",")
    assert set(extras) == {"test", "bench", "pb", "faiss-cpu", "cluster"}

"""The shape of the package (docs/architecture.md): the import contracts of pyproject.toml,
no import cycle anywhere, and a loss declared once with everything else derived from it."""

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

from pml_fieldlosses.app import extras
from pml_fieldlosses.losses.declarations import DECLARATIONS

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def import_cycles(graph):
    """The strongly connected components of more than one module of ``graph`` (a grimp
    ImportGraph), each sorted: every import cycle lies in one (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.find_modules_directly_imported_by(successor)))))
                elif successor in on_stack:
                    low[module] = min(low[module], index[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_between_modules():
    """grimp counts every import, also one inside a function."""
    graph = grimp.build_graph("pml_fieldlosses", cache_dir=None)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    graph = grimp.ImportGraph()
    for importer, imported in [
        ("p.a", "p.b"),
        ("p.b", "p.c"),
        ("p.c", "p.a"),
        ("p.c", "p.d"),
        ("p.d", "p.e"),
        ("p.e", "p.d"),
        ("p.f", "p.a"),
    ]:
        graph.add_import(importer=importer, imported=imported)
    assert sorted(import_cycles(graph)) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]


def test_import_contracts_are_kept():
    """lint-imports with pyproject.toml's contracts: the library never imports the
    application or an extra's package, the application's layers point one way, no cycle
    between the subpackages and modules of any package."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    assert len(re.findall(r" KEPT\b", result.stdout)) == len(contracts)


def test_the_extras_contract_lists_every_extra_package():
    contract = next(
        c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["id"] == "library-without-extras"
    )
    modules = {module for extra in extras.EXTRAS.values() for module in extra.values()}
    assert set(contract["forbidden_modules"]) == modules | {"powerful_benchmarker"}  # installed beside [pb]


def test_every_declared_loss_has_its_test_reference_and_docs():
    """Its PML-style test file exists and compares with the declared naive reference; a
    heading of docs/ names it (docs/losses.md has a '## ClassName' section for each loss
    the kit contributes, as PML's docs; the kit's own test checks their format)."""
    headings = "\n".join(
        line
        for page in sorted((ROOT / "docs").glob("*.md"))
        for line in page.read_text().splitlines()
        if line.startswith("#")
    )
    for declaration in DECLARATIONS:
        name = declaration.loss_class.__name__
        test = ROOT / declaration.test_file
        assert test.is_file(), f"{name}: no {declaration.test_file}"
        module, function = declaration.reference.rsplit(".", 1)
        assert (ROOT / "tests" / f"{module}.py").is_file(), declaration.reference
        imports = {
            (node.module, alias.name)
            for node in ast.walk(ast.parse(test.read_text()))
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert (module, function) in imports, f"{declaration.test_file} does not use {declaration.reference}"
        assert re.search(rf"^#+ .*\b{name}\b", headings, flags=re.M), f"no heading of docs/ names {name}"


TOY_LOSS = r"""
import importlib, json, sys

import torch
from pytorch_metric_learning.losses import BaseMetricLossFunction

from pml_fieldlosses.losses import declarations


class ToyLoss(BaseMetricLossFunction):
    def __init__(self, num_classes, embedding_size, margin=0.5, **kwargs):
        super().__init__(**kwargs)
        self.margin = margin
        self.centres = torch.nn.Parameter(torch.randn(num_classes, embedding_size))

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels):
        distances = torch.cdist(embeddings, self.centres[labels].to(embeddings.dtype))
        losses = torch.relu(distances.diagonal() - self.margin)
        return {"loss": {"losses": losses, "indices": torch.arange(len(labels)), "reduction_type": "element"}}


ToyLoss.__module__ = "pml_fieldlosses.losses.toy_loss"
declarations.DECLARATIONS.append(
    declarations.LossDeclaration(ToyLoss, "Toy", "margin", (0.5, 0.25, 1.0), "naive_toy.toy")
)
import pml_fieldlosses
from pml_fieldlosses import losses

importlib.reload(losses)
from pml_fieldlosses.app import catalog
from pml_fieldlosses.app.upstream import kit, sources
from tests import loss_registry

found = {
    "exported": losses.ToyLoss is ToyLoss and "ToyLoss" in losses.__all__,
    "added": ToyLoss in losses.ADDED_LOSSES,
    "registered": "ToyLoss" in pml_fieldlosses.register(),
    "in_pml": getattr(importlib.import_module("pytorch_metric_learning.losses"), "ToyLoss", None) is ToyLoss,
    "bench": "Toy" in catalog.default_losses() and catalog.LOSSES["Toy"].origin == "ours",
    "grid": catalog.get_entry("Toy").candidates(),
    "variant": type(catalog.get_entry("Toy[margin=0.25]").build(4, 3)).__name__,
    "hyperparameters": catalog.hyperparameters()["Toy"],
    "upstream": "pml_fieldlosses.losses.toy_loss" in sources.LOSS_MODULES,
    "test_tables": "Toy" in loss_registry.ALL_LOSSES,
}
try:
    losses.CrossBatchMemoryWithClassWiseMultiSimilarity(ToyLoss(4, 3), embedding_size=3)
except ValueError as error:
    found["cross_batch_memory"] = "makes no sense for ToyLoss" in str(error)
try:
    kit.apply(sys.argv[1])
except kit.KitError as error:
    found["kit"] = str(error)
print(json.dumps(found))
"""


def test_a_loss_declared_once_reaches_every_derived_list(tmp_path):
    """A toy loss added through one declaration only: the exports, register(), the bench's
    and claims' catalog, the upstream kit's loss modules and the tests' tables pick it up
    (in a process of its own, which it leaves changed)."""
    checkout = tmp_path / "pml"
    for path in [
        "src/pytorch_metric_learning/losses/__init__.py",
        "src/pytorch_metric_learning/losses/cross_batch_memory.py",
        "tests/__init__.py",
    ]:
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text("")
    result = subprocess.run(
        [sys.executable, "-c", TOY_LOSS, str(checkout)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found.pop("grid") == ["Toy[margin=0.5]", "Toy[margin=0.25]", "Toy[margin=1]"]
    assert found.pop("variant") == "ToyLoss"
    assert found.pop("hyperparameters") == {"margin": 0.5}
    # the kit wants the toy's module (and its PML-style test file) among our sources
    assert "toy_loss" in found.pop("kit")
    assert found == {key: True for key in found} and len(found) == 8, found


@pytest.mark.parametrize("declaration", DECLARATIONS, ids=lambda d: d.bench_name)
def test_declarations_name_real_hyperparameters(declaration):
    """The tuned hyperparameter is one the loss (or its ``make``) takes, and the grid starts
    with the constructor's default where it has one (the published default)."""
    parameters = inspect.signature(declaration.make or declaration.loss_class.__init__).parameters
    assert declaration.tuned in parameters, declaration
    default = parameters[declaration.tuned].default
    if default is not inspect.Parameter.empty:
        assert declaration.grid[0] == default, declaration

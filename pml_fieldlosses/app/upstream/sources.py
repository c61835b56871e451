"""Our loss modules rewritten as modules of pytorch_metric_learning.

Rules (no hand-kept copy: everything is derived from the current sources):

* the modules written are the loss modules and everything of ours they import,
  followed transitively; ``pml_fieldlosses.A.B`` becomes ``pytorch_metric_learning.A.B``
  (``RENAMES`` where that name is already taken in PML);
* imports become relative, as PML's own modules write them; a name imported from
  PML's ``losses`` package inside ``losses/`` is imported from the submodule that
  defines it (read from the checkout's ``losses/__init__.py``), so that
  ``losses/__init__.py`` can import the new modules in alphabetical order;
* only the standard library, torch, numpy and PML may be imported;
* dotted names of our modules in comments and docstrings are mapped the same way;
  any other mention of our package is an error.
"""

import ast
import re
import sys
from pathlib import Path

import pml_fieldlosses

from ...losses.declarations import DECLARATIONS

OURS, THEIRS = "pml_fieldlosses", "pytorch_metric_learning"
PACKAGE_DIR = Path(pml_fieldlosses.__file__).resolve().parent
# our module -> its PML module, where the plain mapping would overwrite a PML module
RENAMES = {"pml_fieldlosses.losses.mixins": "pytorch_metric_learning.losses.checked_forward_mixin"}
# the modules of the losses the kit contributes, in the order of their declarations
LOSS_MODULES = [d.loss_class.__module__ for d in DECLARATIONS if d.upstream]
ALLOWED_TOP_LEVEL = {"torch", "numpy", THEIRS} | set(sys.stdlib_module_names)


class KitError(Exception):
    """Our sources use something the transform has no rule for."""


def module_path(module):
    return PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")


def is_our_module(name):
    return name.startswith(OURS + ".") and module_path(name).is_file()


def target_module(module):
    return RENAMES.get(module, THEIRS + module[len(OURS) :])


def target_path(checkout, module):
    return Path(checkout, "src", *target_module(module).split(".")).with_suffix(".py")


def absolute(module, node):
    """The absolute module an ImportFrom in ``module`` names."""
    if node.level == 0:
        return node.module
    base = module.split(".")[: -node.level]
    return ".".join(base + ([node.module] if node.module else []))


def dependencies(module):
    """Our modules that ``module`` imports."""
    found = []
    for node in ast.walk(ast.parse(module_path(module).read_text())):
        if isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            if source == OURS or source.startswith(OURS + "."):
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    found.append(sub if is_our_module(sub) else source)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == OURS:
                    raise KitError(f"{module}: 'import {alias.name}': use 'from ... import' for our modules")
    return found


def closure(modules=LOSS_MODULES):
    """The loss modules and every module of ours they import, in a stable order."""
    seen, todo = [], list(modules)
    while todo:
        module = todo.pop(0)
        if module in seen:
            continue
        if not is_our_module(module):
            raise KitError(
                f"{module} is a package, not a module: import from the module that defines the name"
            )
        seen.append(module)
        todo += dependencies(module)
    return seen


def package_exports(checkout, package):
    """{name: submodule} of the ``from .sub import A, B`` lines of the checkout's package."""
    init = Path(checkout, "src", *package.split("."), "__init__.py")
    exports = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                exports[alias.asname or alias.name] = node.module
    return exports


def relative(from_module, to_module):
    """``from_module``'s relative spelling of ``to_module`` (both absolute, in PML)."""
    here = from_module.split(".")[:-1]
    there = to_module.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def rewrite_import(module, node, checkout):
    """The PML import statement(s) replacing ``node`` in ``module``; None: unchanged."""
    me = target_module(module)
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] not in ALLOWED_TOP_LEVEL:
                raise KitError(f"{module}: 'import {alias.name}' is not torch, numpy, PML or stdlib")
        return None
    source = absolute(module, node)
    top = source.split(".")[0]
    if top == OURS:
        groups = {}
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if is_our_module(sub):  # from ..utils import checks
                target = target_module(sub)
                parent, name = target.rsplit(".", 1)
                groups.setdefault(parent, []).append(
                    name
                    if name == (alias.asname or alias.name)
                    else f"{name} as {alias.asname or alias.name}"
                )
            else:
                groups.setdefault(target_module(source), []).append(ast.unparse(alias))
        return [f"from {relative(me, t)} import {', '.join(names)}" for t, names in groups.items()]
    if top == THEIRS:
        package = me.rsplit(".", 1)[0]
        if source == package:  # a name of our own package: import it from its submodule
            exports = package_exports(checkout, package)
            groups = {}
            for alias in node.names:
                if alias.name not in exports:
                    raise KitError(f"{module}: {alias.name} is not exported by {package} of the checkout")
                groups.setdefault(exports[alias.name], []).append(ast.unparse(alias))
            return [f"from .{sub} import {', '.join(names)}" for sub, names in sorted(groups.items())]
        return [f"from {relative(me, source)} import {', '.join(ast.unparse(a) for a in node.names)}"]
    if top not in ALLOWED_TOP_LEVEL:
        raise KitError(f"{module}: imports {source}, which is not torch, numpy, PML or stdlib")
    return None


MENTION = re.compile(r"\b" + OURS + r"(?:\.\w+)*")


def map_mentions(text, where):
    """Our dotted module names in text -> PML's; any other mention is an error."""

    def replace(match):
        name = match.group(0)
        while name and not is_our_module(name):
            name = name.rpartition(".")[0]
        if not name or name == OURS:
            raise KitError(f"{where}: mentions {match.group(0)}, which has no place in PML")
        return target_module(name) + match.group(0)[len(name) :]

    return MENTION.sub(replace, text)


def transform(module, checkout):
    """The source of ``module`` as a PML module."""
    text = module_path(module).read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    # every import, also one inside a function
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
        new = rewrite_import(module, node, checkout)
        if new is None:
            continue
        indent = lines[node.lineno - 1][: node.col_offset]
        lines[node.lineno - 1 : node.end_lineno] = [f"{indent}{statement}\n" for statement in new]
    result = map_mentions(sort_imports("".join(lines)), module)
    ast.parse(result, feature_version=(3, 8))  # PML's oldest CI Python
    return result


def sort_imports(text):
    """The module's leading block of imports in isort's sections (stdlib, third party,
    relative; ``import x`` before ``from x import``, alphabetical), as PML's modules have
    them. A block with comments in it is left as it is."""
    tree = ast.parse(text)
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) else tree.body
    block = []
    for node in body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            break
        block.append(node)
    if not block:
        return text
    lines = text.splitlines(keepends=True)
    region = lines[block[0].lineno - 1 : block[-1].end_lineno]
    if any(line.strip().startswith("#") for line in region):
        return text
    sections = {0: [], 1: [], 2: []}
    for node in block:
        statement = ast.unparse(node)
        if isinstance(node, ast.ImportFrom) and node.level:
            sections[2].append((-node.level, node.module or "", statement))
        else:
            top = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
            section = 0 if top in sys.stdlib_module_names else 1
            sections[section].append((isinstance(node, ast.ImportFrom), statement.lower(), statement))
    groups = ["".join(s[-1] + "\n" for s in sorted(entries)) for entries in sections.values() if entries]
    lines[block[0].lineno - 1 : block[-1].end_lineno] = ["\n".join(groups)]
    return "".join(lines)


def exported_classes(module):
    """The public classes ``module`` defines that our losses package exports."""
    import pml_fieldlosses.losses as ours

    tree = ast.parse(module_path(module).read_text())
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef) and not n.name.startswith("_") and hasattr(ours, n.name)
    ]


def new_packages(modules, checkout):
    """{our package: its ``__init__.py`` as PML's} for each package of ours that ``modules``
    sit in and the checkout does not have yet (e.g. losses/potential/), so that a wheel of
    the patched PML (``find_packages``) includes them. Such an ``__init__.py`` may hold a
    docstring only: the kit's modules import each name from the module that defines it."""
    packages = {}
    for module in modules:
        package = module.rsplit(".", 1)[0]
        init = PACKAGE_DIR.joinpath(*package.split(".")[1:], "__init__.py")
        if (
            package in packages
            or target_path(checkout, package).with_suffix("").joinpath("__init__.py").is_file()
        ):
            continue
        tree = ast.parse(init.read_text())
        if any(
            not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in tree.body
        ):
            raise KitError(f"{package}/__init__.py holds more than a docstring: the kit cannot copy it")
        packages[package] = map_mentions(init.read_text(), f"{package}/__init__.py")
    return packages

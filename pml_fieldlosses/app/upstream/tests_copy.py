"""Our PML-style unittest files (tests/losses/test_<module>.py) as PML test files.

Each of our contributed losses has a real unittest file in our tests/losses/, written as
PML's own (``from .. import TEST_DEVICE, TEST_DTYPES``) and run by our suite. The kit
copies it into the checkout with two rewrites:

* our losses are imported from ``pytorch_metric_learning.losses``;
* what the file imports from our other test modules (the naive references of
  tests/naive*.py, the shared check of tests/losses/exactness.py) is copied into it,
  followed transitively: the top-level definitions it needs, in an order where each comes
  after what it uses, with the imports they need (only the standard library, torch and
  PML's ``tests`` package may be imported there).

Nothing is kept here: the test files are read from our current sources.
"""

import ast
from pathlib import Path

from .sources import ALLOWED_TOP_LEVEL, THEIRS, KitError, map_mentions, sort_imports


def test_module_path(module, level, name):
    """The file, relative to tests/, of our test module that ``from <level dots><name> import``
    in ``module`` (relative to tests/, e.g. losses/test_x.py) names; None for the ``tests``
    package itself."""
    here = Path(module).parent.parts
    base = here[: len(here) - (level - 1)] if level > 1 else here
    if level - 1 > len(here):
        raise KitError(f"tests/{module}: a relative import above tests/")
    if not name:
        return None if not base else Path(*base, "__init__.py")
    return Path(*base, *name.split(".")).with_suffix(".py")


class TestModule:
    """One of our test modules: its top-level definitions and what its names import."""

    def __init__(self, tests_dir, relative):
        self.relative = Path(relative)
        path = Path(tests_dir, relative)
        if not path.is_file():
            raise KitError(f"tests/{relative} does not exist")
        self.text = path.read_text()
        self.tree = ast.parse(self.text)
        self.definitions = {}  # name -> node
        self.imports = {}  # name -> (node, alias)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.definitions[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            self.definitions[name.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.imports[bound] = (node, alias)

    def source(self, node):
        """The node's source, with its decorators."""
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "".join(self.text.splitlines(keepends=True)[first - 1 : node.end_lineno]).rstrip("\n")


def used_names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class Copier:
    """Collects the definitions a test file needs from our test modules."""

    def __init__(self, tests_dir):
        self.tests_dir = Path(tests_dir)
        self.modules = {}
        self.emitted = []  # (module, node), dependencies first
        self.seen = set()
        self.bound = {}  # name -> the module whose definition of it is copied
        self.imports = set()  # import statements the copied definitions need

    def module(self, relative):
        if relative not in self.modules:
            self.modules[relative] = TestModule(self.tests_dir, relative)
        return self.modules[relative]

    def need(self, module, name):
        """Copy ``name`` as ``module`` (a TestModule) binds it, after what it uses."""
        if name in module.definitions:
            node = module.definitions[name]
            if (module.relative, id(node)) in self.seen:
                return
            if self.bound.setdefault(name, module.relative) != module.relative:
                raise KitError(
                    f"the copied test code needs {name} of tests/{module.relative} "
                    f"and of tests/{self.bound[name]}"
                )
            self.seen.add((module.relative, id(node)))
            for used in sorted(used_names(node)):
                self.need(module, used)
            self.emitted.append((module, node))
        elif name in module.imports:
            node, alias = module.imports[name]
            self.need_import(module, node, alias)

    def need_import(self, module, node, alias):
        if isinstance(node, ast.ImportFrom) and node.level:
            target = test_module_path(module.relative, node.level, node.module)
            if target is None:  # from .. import TEST_DEVICE: PML's tests package has it too
                if module.relative.parent != Path("losses"):
                    raise KitError(f"tests/{module.relative}: the copied code needs {alias.name} of tests/")
                self.imports.add(f"from .. import {ast.unparse(alias)}")
                return
            if alias.asname:
                raise KitError(f"tests/{module.relative}: 'import ... as' of our test modules is not copied")
            self.need(self.module(target), alias.name)
            return
        top = (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        if top not in ALLOWED_TOP_LEVEL:
            raise KitError(
                f"tests/{module.relative}: the copied code needs {top}, not stdlib, torch, numpy or PML"
            )
        if isinstance(node, ast.ImportFrom):
            self.imports.add(f"from {node.module} import {ast.unparse(alias)}")
        else:
            self.imports.add(f"import {ast.unparse(alias)}")


def pml_test_file(tests_dir, relative):
    """The source of our test file ``tests_dir/relative`` (e.g. losses/test_x.py) as PML's."""
    copier = Copier(tests_dir)
    test = copier.module(relative)
    body, own_imports, docstring = [], [], ""
    nodes = test.tree.body
    if nodes and isinstance(nodes[0], ast.Expr) and isinstance(nodes[0].value, ast.Constant):
        docstring, nodes = test.source(nodes[0]) + "\n\n", nodes[1:]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level and node.module:
            for alias in node.names:
                copier.need_import(test, node, alias)
        elif isinstance(node, ast.ImportFrom) and node.level:
            own_imports.append(ast.unparse(node))  # from .. import TEST_DEVICE, TEST_DTYPES
        elif isinstance(node, ast.ImportFrom) and node.module == "pml_fieldlosses.losses":
            own_imports.append(f"from {THEIRS}.losses import {', '.join(ast.unparse(a) for a in node.names)}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            top = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).split(".")[0]
            if top not in ALLOWED_TOP_LEVEL:
                raise KitError(f"tests/{relative}: imports {top}, which is not stdlib, torch, numpy or PML")
            own_imports.append(ast.unparse(node))
        else:
            body.append(test.source(node))
    # each module's definitions in its own order, the modules in the order they were needed
    # first (what a definition uses of another module was needed before it)
    rank = {}
    for module, _ in copier.emitted:
        rank.setdefault(module.relative, len(rank))
    emitted = sorted(copier.emitted, key=lambda item: (rank[item[0].relative], item[1].lineno))
    copied = [module.source(node) for module, node in emitted]
    clash = sorted(set(copier.bound) & (set(test.definitions) - set(test.imports)))
    if clash:
        raise KitError(f"tests/{relative} defines {clash}, which the code it copies defines too")
    header = (
        "\n# From our naive references and shared check: explicit loops over samples, classes and pairs.\n"
    )
    source = (
        docstring
        + sort_imports("\n".join(merged(own_imports + sorted(copier.imports))) + "\n")
        + "\n\n"
        + (header + "\n\n\n".join(copied) + "\n\n\n" if copied else "")
        + "\n\n\n".join(body)
        + "\n"
    )
    source = map_mentions(source, f"tests/{relative}")
    ast.parse(source, feature_version=(3, 8))  # PML's oldest CI Python
    return source


def merged(statements):
    """The import statements with one ``from`` line per module (the copied code's
    ``from .. import TEST_DEVICE`` beside the test file's ``from .. import TEST_DTYPES``)."""
    names = {}
    for statement in statements:
        node = ast.parse(statement).body[0]
        if isinstance(node, ast.ImportFrom):
            source = "." * node.level + (node.module or "")
            names.setdefault(source, set()).update(ast.unparse(alias) for alias in node.names)
        else:
            names.setdefault(statement, None)
    return [
        key if aliases is None else f"from {key} import {', '.join(sorted(aliases))}"
        for key, aliases in names.items()
    ]

"""Edits of files the checkout already has: losses/__init__.py, CrossBatchMemory's
supported losses and the test list that must match them, docs/losses.md. Each edit is
idempotent (running the kit twice changes nothing the second time)."""

import ast
import re
from pathlib import Path

from .sources import KitError, map_mentions


def add_exports(init_text, exports):
    """``exports``: {submodule: [names]}. One ``from .sub import A, B`` line per submodule,
    inserted in the alphabetical order of PML's lines (by submodule)."""
    lines = init_text.splitlines(keepends=True)
    if not any(re.match(r"from \.(\w+) import", line) for line in lines):
        raise KitError("expected PML's 'from .<module> import <Class>' lines, found none")
    for sub, names in sorted(exports.items()):
        line = f"from .{sub} import {', '.join(sorted(names))}\n"
        if line in lines:
            continue
        position = len(lines)
        for i, existing in enumerate(lines):
            match = re.match(r"from \.(\w+) import", existing)
            if match and match.group(1) > sub:
                position = i
                break
        lines.insert(position, line)
    return "".join(lines)


def string_list_span(text, function):
    """(node, values, indent) of the list of string literals that ``function`` (a def in
    ``text``) returns."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for ret in ast.walk(node):
                if (
                    isinstance(ret, ast.Return)
                    and isinstance(ret.value, ast.List)
                    and ret.value.elts
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in ret.value.elts)
                ):
                    values = ast.literal_eval(ret.value)
                    first = ret.value.elts[0]
                    return ret.value, values, first.col_offset
    raise KitError(f"expected a def {function}() returning a list of names in quotes, found none")


def replace_node_lines(text, node, new_lines):
    lines = text.splitlines(keepends=True)
    lines[node.lineno - 1 : node.end_lineno] = new_lines
    return "".join(lines)


def add_supported_losses(cbm_text, names):
    """Add ``names`` to the list CrossBatchMemory.supported_losses() returns (sorted, as PML's)."""
    node, values, indent = string_list_span(cbm_text, "supported_losses")
    values = sorted(set(values) | set(names))
    head = cbm_text.splitlines()[node.lineno - 1]
    opening = head[: node.col_offset] + "["
    closing = " " * (indent - 4) + "]" + cbm_text.splitlines()[node.end_lineno - 1][node.end_col_offset :]
    body = [f'{" " * indent}"{v}",\n' for v in values]
    return replace_node_lines(cbm_text, node, [opening + "\n"] + body + [closing + "\n"])


def add_to_loss_lists(test_text, names):
    """In a PML test that checks its list of loss instances against supported_losses():
    add ``losses.Name()`` for each of ``names`` to that list (sorted position)."""
    tree = ast.parse(test_text)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.FunctionDef) and "supported_losses" in ast.unparse(node)):
            continue
        for assign in ast.walk(node):
            if (
                isinstance(assign, ast.Assign)
                and isinstance(assign.value, ast.List)
                and all(isinstance(e, ast.Call) for e in assign.value.elts)
                and assign.value.elts
            ):
                elts = assign.value.elts
                present = {ast.unparse(e.func).split(".")[-1] for e in elts}
                indent = elts[0].col_offset
                prefix = ast.unparse(elts[0].func).rsplit(".", 1)[0] + "."
                lines = test_text.splitlines(keepends=True)
                for name in sorted(set(names) - present, reverse=True):
                    position = next((e for e in elts if ast.unparse(e.func).split(".")[-1] > name), None)
                    row = position.lineno - 1 if position else elts[-1].end_lineno
                    lines.insert(row, f"{' ' * indent}{prefix}{name}(),\n")
                return "".join(lines)
    raise KitError(
        "expected a list of loss instances (losses.<Loss>(), ...) in the test that calls "
        "CrossBatchMemory.supported_losses(), found none"
    )


# ----------------------------------------------------------------------------- docs

DISTANCE_LINKS = r"`((CosineSimilarity|LpDistance|DotProductSimilarity|SNRDistance)\([^`]*\))`"
REDUCERS = r"`?\b(MeanReducer|SumReducer|AvgNonZeroReducer|DoNothingReducer)\b`?"


def doc_sections(markdown, names):
    """{name: the '## name' section of our docs/losses.md}."""
    sections, current = {}, None
    for line in markdown.splitlines(keepends=True):
        match = re.match(r"## (\w+)\s*$", line)
        if match or line.startswith("# "):
            current = match.group(1) if match and match.group(1) in names else None
            if current:
                sections[current] = ""
        if current:
            sections[current] += line
    missing = set(names) - set(sections)
    if missing:
        raise KitError(f"docs/losses.md has no section for {sorted(missing)}")
    return sections


def defaults_from_code(loss_class, make_loss):
    """PML's closing items of a loss section, from the class itself: its default distance
    and reducer (the expressions its get_default_* methods return) and the reducer input
    (the sub-losses and reduction types of one forward of ``make_loss()``)."""
    import inspect

    import torch

    def returned(method):
        for klass in loss_class.__mro__:
            if method in vars(klass):
                tree = ast.parse(inspect.getsource(vars(klass)[method]).strip())
                node = next(n for n in ast.walk(tree) if isinstance(n, ast.Return))
                return ast.unparse(node.value)
        raise KitError(f"{loss_class.__name__} has no {method}")

    loss = make_loss()
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(
        8, loss.embedding_size if hasattr(loss, "embedding_size") else 6, generator=generator
    )
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    loss_dict = loss.compute_loss(embeddings, labels, None, embeddings, labels)
    distance, reducer = returned("get_default_distance"), returned("get_default_reducer")
    reducer_name = reducer.split("(")[0]
    items = "\n".join(
        f'* **{key}**: reduction type ```"{value["reduction_type"]}"```.' for key, value in loss_dict.items()
    )
    return {
        "**Default distance**": f"**Default distance**: \n\n - `{distance}`\n",
        "**Default reducer**": f"**Default reducer**: \n\n - `{reducer_name}`\n",
        "**Reducer input**": f"**Reducer input**:\n\n{items}\n",
    }


def pml_doc_format(section, name, defaults=None):
    """Our section in PML's format: headings with a colon, distances and reducers linked
    to PML's pages, our own doc links unlinked, our module names mapped; ``defaults``
    (see defaults_from_code) supply the closing items a section lacks."""
    for heading, text in (defaults or {}).items():
        if not re.search(rf"^{re.escape(heading)}", section, flags=re.M):
            section = section.rstrip("\n") + "\n\n" + text
    section = re.sub(
        r"^\*\*(Equation|Parameters|Other info|Reducer input|Learnable)\*\*(?!:)",
        r"**\1**:",
        section,
        flags=re.M,
    )
    section = re.sub(r"\[([^\]]+)\]\((?!https?:)[^)]*\)", r"\1", section)  # our docs' links
    lines = []
    for line in section.splitlines(keepends=True):
        if line.startswith((" - `", "**Default distance**")):
            line = re.sub(DISTANCE_LINKS, lambda m: f"[```{m[1]}```](distances.md#{m[2].lower()})", line)
        if line.startswith((" - `", "**Default reducer**")):
            line = re.sub(REDUCERS, lambda m: f"[{m[1]}](reducers.md#{m[1].lower()})", line)
        lines.append(line)
    return map_mentions("".join(lines).rstrip("\n") + "\n\n", f"docs/losses.md ## {name}")


def add_doc_sections(pml_docs, sections):
    """Insert each section before the first '## ' section of PML's docs that sorts after it."""
    if not re.search(r"^## \w+", pml_docs, flags=re.M):
        raise KitError("expected PML's '## <Loss>' sections, found none")
    for name, section in sorted(sections.items()):
        if re.search(rf"^## {name}\s*$", pml_docs, flags=re.M):
            continue
        headers = list(re.finditer(r"^## (\w+)", pml_docs, flags=re.M))
        after = next((h for h in headers if h.group(1).lower() > name.lower()), None)
        at = after.start() if after else len(pml_docs)
        pml_docs = pml_docs[:at] + section + pml_docs[at:]
    return pml_docs


def read(path):
    return Path(path).read_text()

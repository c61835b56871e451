"""The hyperparameter selection: every candidate of every loss's tuned
hyperparameter (catalog.LossEntry.grid, three each) trained once with the
benchmark's protocol and budget and the seed SELECTION_SEED (not one of the
reported seeds), compared by their best validation MAP@R. The test split is
never evaluated. Ties keep the published default.

pml-fieldlosses select                                # every loss, default data
pml-fieldlosses select --losses PFML,CPML --data PATH

It prints the table and the ``SELECTED`` dict to put in pml_fieldlosses/app/catalog.py.
The selection's folder is the command's alone while it runs (pipeline.hold_folders), and
selection.json is written whole or not at all.
"""

import sys
import time

from ..catalog import get_entry
from ..errors import UsageError
from .pipeline import Part, hold_folders, prepare_part
from .result import write_json

SELECTION_SEED = 1000


def select(config, file=None):
    """Run the selection for ``config.losses`` (resuming finished runs) and
    return {loss: [(value, best validation MAP@R, best epoch, seconds), ...]}
    in grid order."""
    file = file or sys.stderr
    entries = selectable_entries(config.losses)
    jobs = [(name, SELECTION_SEED) for entry in entries for name in entry.candidates()]
    part = Part(config, jobs, selection=True)
    with hold_folders([part.folder], file):
        print(f"hyperparameter selection -> {part.folder}", file=file)
        results = {r["loss"]: r for r in prepare_part(part, file).run(file)}
        table = selection_table(entries, results)
        write_json(part.folder / "selection.json", table)
    return table


def selection_table(entries, results):
    """{loss: [(value, best validation MAP@R, best epoch, seconds), ...]} of ``results``
    ({candidate name: RunResult}), in grid order."""
    table = {}
    for entry in entries:
        table[entry.name] = [
            (
                value,
                results[name]["best_val_map_at_r"],
                results[name]["best_epoch"],
                results[name]["run_seconds"],
            )
            for value, name in zip(entry.grid, entry.candidates())
        ]
    return table


def selectable_entries(names):
    """The catalog entries of ``names``; a name may fix other settings (e.g.
    PFML[alpha=2]) but not the tuned hyperparameter, whose every value select tries."""
    entries = [get_entry(name) for name in names]
    fixed = [e.name for e in entries if e.tuned in _keys_set_in(e.name)]
    if fixed:
        raise UsageError(
            f"select tries every value of each loss's tuned hyperparameter itself: do not set it in "
            f"the name ({', '.join(fixed)}); other settings are kept, e.g. PFML[alpha=2]"
        )
    return entries


def _keys_set_in(name):
    settings = name.partition("[")[2].rstrip("]")
    return {item.partition("=")[0].strip() for item in settings.split(",") if item}


def chosen(table):
    """{loss: value} with the best validation MAP@R (the first, i.e. the
    published default, on ties)."""
    return {name: max(rows, key=lambda row: row[1])[0] for name, rows in table.items()}


def markdown(table):
    lines = ["| loss | hyperparameter | candidates: val MAP@R (best epoch) | selected |", "|---|---|---|---|"]
    best = chosen(table)
    for name, rows in table.items():
        cells = ", ".join(
            f"{v:g}: {m:.3f} ({e})" + (" (default)" if i == 0 else "") for i, (v, m, e, _) in enumerate(rows)
        )
        lines.append(f"| {name} | {get_entry(name).tuned} | {cells} | {best[name]:g} |")
    return "\n".join(lines)


def run_selection(config, file=None):
    """``pml-fieldlosses select``: run the selection and print its table and choice."""
    start = time.perf_counter()
    table = select(config, file)
    print(markdown(table), file=file)
    best = chosen(table)
    print(f"\nSELECTED = {best!r}", file=file)
    variants = ",".join(get_entry(name).variant(value) for name, value in best.items())
    print(f"for the bench on this data: pml-fieldlosses bench --losses '{variants}'", file=file)
    print(f"wall time: {time.perf_counter() - start:.0f} s", file=file)
    return table

"""The claims report: the verdict table (terminal and Markdown), the
comparisons (CSV), summary.json and a figure per claim.

The tables and summary are written first, each whole or not at all (errors.atomic_write);
the figures come last: one that cannot be drawn is skipped with a one-line warning naming
it and why, which README.md repeats."""

import csv
import io
import math
import sys

from ..backbones import get_backbone
from ..bench.figures import Figures
from ..bench.pipeline import report_log
from ..bench.result import write_json
from ..errors import atomic_write, file_fault
from .measures import summary
from .table import MEASURES
from .verdict import EQUIVALENCE, RULE


def _number(x, signed=False):
    if math.isnan(x):
        return "n/a"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def missing_text(missing, at_most=3):
    """[(loss, seed)] in words, at most ``at_most`` named: CPML seed 1, PFML seed 0 and 2 more."""
    text = ", ".join(f"{name} seed {seed}" for name, seed in missing[:at_most])
    return text + (f" and {len(missing) - at_most} more" if len(missing) > at_most else "")


def missing_warning(evaluated):
    """One line naming the comparisons with missing values, or None."""
    cases = [
        f"{e['claim'].id} {p['comparison'].measure}: {missing_text(p['missing'])}"
        for e in evaluated
        for p in e["parts"]
        if p["missing"]
    ]
    if not cases:
        return None
    return "warning: no value (inconclusive) for " + "; ".join(cases)


def _ci(part):
    interval = part["interval"]
    if part["missing"]:
        return f"n/a: no value for {missing_text(part['missing'])}"
    if interval.n < 2:
        return "n/a (< 2 seeds)"
    text = f"[{_number(interval.low, True)}, {_number(interval.high, True)}]"
    if part["censored"]:
        total = (len(part["comparison"].a) + len(part["comparison"].b)) * interval.n
        text += f" censored: {part['censored']}/{total} runs at the epoch limit"
    return text


def _direction(comparison):
    # no "|" (Markdown cells)
    return {"greater": "a > b", "less": "a < b", "none": f"a ≈ b (±{EQUIVALENCE:g})"}[comparison.direction]


def comparison_rows(evaluated):
    """One row per comparison: claim id, a, b, measure, noise, claimed, means, Δ, CI, verdict."""
    rows = []
    for e in evaluated:
        for p in e["parts"]:
            c, interval = p["comparison"], p["interval"]
            rows.append(
                [
                    e["claim"].id,
                    " + ".join(c.a),
                    " + ".join(c.b),
                    c.measure + (f" @ {c.noise:.0%} noise" if c.noise else ""),
                    _direction(c),
                    _number(sum(p["a"]) / len(p["a"])),
                    _number(sum(p["b"]) / len(p["b"])),
                    _number(interval.mean, True),
                    _ci(p),
                    p["verdict"],
                ]
            )
    return rows


COMPARISON_HEADER = [
    "claim",
    "a",
    "b",
    "measure",
    "claimed",
    "a mean",
    "b mean",
    "Δ = a − b",
    "95 % CI",
    "verdict",
]
VERDICT_HEADER = ["claim", "paper", "section", "verdict", "comparisons (reproduced / not / inconclusive)"]


def verdict_rows(evaluated):
    rows = []
    for e in evaluated:
        verdicts = [p["verdict"] for p in e["parts"]]
        counts = "/".join(str(verdicts.count(v)) for v in ("reproduced", "not reproduced", "inconclusive"))
        claim = e["claim"]
        rows.append([claim.id, claim.paper.split(" (")[0], claim.section, e["verdict"], counts])
    return rows


def _text(header, rows):
    table = [header] + rows
    widths = [max(len(str(line[i])) for line in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def settings_line(config):
    return (
        f"backbone {config.backbone} ({get_backbone(config.backbone).trunk} trunk), {config.image_size} px, embedding "
        f"{config.embedding_size}, {config.seeds} seeds, at most {config.epochs} epochs (patience "
        f"{config.patience}, lr × {config.lr_decay:g} every {config.lr_decay_epochs}), "
        f"{config.aug_views} augmented view(s)" + (" (--quick)" if config.quick else "")
    )


def text_table(evaluated, config, data):
    """What the command prints: the verdict per claim, then every comparison."""
    return "\n".join(
        [
            f"Claims on {data}: {settings_line(config)}",
            "",
            _text(VERDICT_HEADER, verdict_rows(evaluated)),
            "",
            _text(COMPARISON_HEADER, comparison_rows(evaluated)),
            "",
            "Rule: " + RULE,
        ]
    )


def write_csv(evaluated, data, path):
    """Every comparison, numbers unformatted, with the data set's name (one file per data set)."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(
        ["data", "claim", "a", "b", "measure", "noise", "direction", "a_mean", "b_mean"]
        + ["difference", "ci95_low", "ci95_high", "seeds", "censored_runs", "missing", "verdict"]
        + ["claim_verdict"]
    )
    for e in evaluated:
        for p in e["parts"]:
            c, interval = p["comparison"], p["interval"]
            writer.writerow(
                [data, e["claim"].id, " + ".join(c.a), " + ".join(c.b), c.measure, c.noise, c.direction]
                + [f"{sum(p['a']) / len(p['a']):.5f}", f"{sum(p['b']) / len(p['b']):.5f}"]
                + [f"{interval.mean:.5f}", f"{interval.low:.5f}", f"{interval.high:.5f}", interval.n]
                + [p["censored"], "; ".join(f"{name} seed {s}" for name, s in p["missing"])]
                + [p["verdict"], e["verdict"]]
            )
    with atomic_write(path, "wb", doing="writing the comparisons") as f:
        f.write(text.getvalue().encode())


def write_markdown(evaluated, config, info, plots, path, skipped=()):
    seeds_note = ""
    if config.seeds == 1:
        seeds_note = " With 1 seed no interval can be computed: every comparison is inconclusive."
    elif config.seeds < 3:
        seeds_note = (
            f" With {config.seeds} seeds the t-interval is wide (t(0.975, {config.seeds - 1}) = "
            f"{_t(config.seeds):.1f}): most comparisons can only be inconclusive."
        )
    lines = [
        f"# pml-fieldlosses claims: {info['data']}, {config.backbone} ({get_backbone(config.backbone).trunk} trunk)",
        "",
        f"Data: {info['data']}. Settings: {settings_line(config)}; every other setting is the bench's "
        "protocol (docs/bench.md), and each run is the bench's run of that loss and seed (result folders: "
        + ", ".join(f"`{name}`" for name in info["folders"].values())
        + f"). {info['runs']} runs.{seeds_note}",
        "",
        "## Verdicts",
        "",
        _markdown(VERDICT_HEADER, verdict_rows(evaluated)),
        "",
        "**Rule.** " + RULE,
        "",
        "## Comparisons",
        "",
        _markdown(COMPARISON_HEADER, comparison_rows(evaluated)),
        "",
        "Measures: " + "; ".join(f"`{k}`: {v[0]}" for k, v in MEASURES.items()) + ".",
        "",
        "## The claims",
        "",
    ]
    for e in evaluated:
        claim = e["claim"]
        lines += [
            f"### {claim.id}: {e['verdict']}",
            "",
            f"{claim.paper}, {claim.section}: *{claim.claim}*",
            "",
            f"Experiment: {claim.experiment}",
            "",
        ]
        if claim.id in plots:
            lines += [f"![{claim.id}]({plots[claim.id]})", ""]
    if skipped:
        lines += ["Figures not drawn: " + "; ".join(f"`{name}` ({why})" for name, why in skipped) + ".", ""]
    lines += [
        f"Wall time: {info['wall_seconds']:.0f} s (the sum of {info['invocations']} invocation(s) on this "
        "folder, data loading and feature extraction included).",
        "",
        "Files: `comparisons.csv` (every comparison), `summary.json` (per-seed values), `plots/`.",
        "",
    ]
    with atomic_write(path, doing="writing the report") as f:
        f.write("\n".join(lines))


def _t(seeds):
    from scipy.stats import t

    return float(t.ppf(0.975, seeds - 1))


def write(evaluated, runs, config, info, out_dir, file=None):
    """Every file of the report in ``out_dir``: the tables and summary, then the figures.
    Returns {claim id: figure file name} of the figures drawn."""
    write_csv(evaluated, info["data"], out_dir / "comparisons.csv")
    write_summary(evaluated, info, out_dir / "summary.json")
    write_markdown(evaluated, config, info, {}, out_dir / "README.md")  # the figures come next
    made, skipped = draw_figures(evaluated, runs, config, out_dir, file or sys.stderr)
    write_markdown(evaluated, config, info, made, out_dir / "README.md", skipped)
    return made


def draw_figures(evaluated, runs, config, out_dir, file):
    """One figure per claim in ``out_dir``/plots; returns ({claim id: file name} drawn,
    [(file name, why)] skipped). A file-system fault is not skipped: it stops the command."""
    from . import plots  # matplotlib only when there is something to draw

    try:
        (out_dir / "plots").mkdir(exist_ok=True)
    except OSError as e:
        raise file_fault(e, out_dir / "plots", "creating") from e
    figures = Figures(out_dir, file)
    with report_log(out_dir):
        for e in evaluated:
            claim = e["claim"].id
            figures.draw(claim, f"plots/{claim}.png", plots.claim_figure, e, runs, config.seeds)
    return dict(figures.made), figures.skipped


def write_summary(evaluated, info, path):
    """summary.json: the run's info and every claim with its per-seed values (measures.summary)."""
    write_json(path, {"info": info, "claims": summary(evaluated)})

"""The user documentation (README.md and docs/*.md) reads as a manual, not a lab notebook:
no paths of the machine a measurement ran on, no issue references, no commit hashes, no
mentions of a specification that is not in this repository, no session talk; and every
link to another page of the documentation points at a file that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# An npm package's integrity string (Subresource Integrity: "sha512-" and base64) is data, and
# its base64 may by chance hold a run of hex digits: removed before the checks, in this form only.
INTEGRITY = re.compile(r"\bsha(?:256|384|512)-[A-Za-z0-9+/]{40,}={0,2}")

FORBIDDEN = {
    # /work/..., /root/..., /tmp/..., /home/..., /Users/... (not a URL's path, not ~/...)
    "a local path": re.compile(r"(?<![\w.~:/-])/(?:work|root|tmp|home|Users)/"),
    # "issue 16", "issues 12 and 16", "issue #16", "#16", "PML#309"
    "an issue reference": re.compile(r"\bissues? #?\d+|(?<![&\w])#\d+\b|\w#\d+\b", re.IGNORECASE),
    # 7 to 40 hex digits with at least one digit and one letter a-f: a commit hash, not a
    # number (1000000) or a word that happens to be hex (defaced, effaced)
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "a mention of the specification outside the repository": re.compile(
        r"\bLOSSES\.md|\bshared/(?:spec|notes)\b|\b[Ss]pec(?:'s)?\b|\b[Pp]roject's specification\b"
    ),
    "session talk": re.compile(
        r"\bDone-when\b|\bthis session\b|\bstop \d+\b|\bprevious stop\b", re.IGNORECASE
    ),
}


def violations(text):
    """(line number, what, the matched text) for every forbidden mention in ``text``. Line
    breaks count as spaces, so a mention wrapped over two lines is found too."""
    flat = INTEGRITY.sub(lambda m: "x" * len(m.group(0)), text).replace("\n", " ")
    found = []
    for what, pattern in FORBIDDEN.items():
        for match in pattern.finditer(flat):
            found.append((text.count("\n", 0, match.start()) + 1, what, match.group(0)))
    return sorted(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_has_no_notebook_references(page):
    found = violations(page.read_text())
    assert not found, "\n".join(
        f"{page.relative_to(ROOT)}:{number}: {what}: {text!r}" for number, what, text in found
    )


def anchors(page):
    """GitHub's anchors of the headings of ``page``: lower case, punctuation dropped, spaces as -."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    headings = re.findall(r"^#+ (.*?)\s*$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_to_pages_resolve(page):
    """Relative links ``[text](other.md#anchor)`` and ``[text](#anchor)`` name a file that
    exists and, for a Markdown page, a heading it has."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = (page.parent / target) if target else page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links: {broken}"


@pytest.mark.parametrize(
    "text, kind",
    [
        ("measured at commit 804ba6a", "a commit hash"),
        ("the integrity sha512 is not 1b67d34", "a commit hash"),
        ("the data in /work/data/glyphs", "a local path"),
        ("run from /tmp/x", "a local path"),
        ("see issue 16", "an issue reference"),
        ("issues 12 and 16", "an issue reference"),
        ("fixed in #16", "an issue reference"),
        ("the failure of PML#309", "an issue reference"),
        ("written from ../shared/spec/LOSSES.md", "a mention of the specification outside the repository"),
        ("(spec §9.7)", "a mention of the specification outside the repository"),
        ("spec 6.4", "a mention of the specification outside the repository"),
        ("the spec's sum as written", "a mention of the specification outside the repository"),
        ("the project's specification", "a mention of the specification outside the repository"),
        ("the Done-when of the task", "session talk"),
        ("at stop 17", "session talk"),
    ],
)
def test_each_kind_is_found(text, kind):
    assert kind in [what for _, what, _ in violations(text)]


def test_a_mention_wrapped_over_two_lines_is_reported_at_its_first_line():
    assert violations("line one\nfixed in issue\n16 here\n") == [(2, "an issue reference", "issue 16")]


@pytest.mark.parametrize(
    "text",
    [
        "sha512-6P2rhlrV0AoTTMrEf+1h7azRjQiMMcZ8RpV+NuxGPaOKhwwpbqsE3HsQY01PYYa/KJbf6UxuyVlcVVGzK3ywfw==",
        "sha512-abc1234deadbeef0123456789abcdef0123456789abcdef0123456789abcde/0123456789abcdef==",
        "the tarball's sha512 and the sha256 of every file",
        "a defaced or effaced decade, 1000000 steps, 11 318 classes, 2.6e8 pairs, 3e-16",
        "~/.cache/pml-fieldlosses and /shared/experiments on a cluster",
        "https://github.com/KevinMusgrave/pytorch-metric-learning",
        "[bench.md](bench.md#multi-vendor-emoji-default---data-emoji), a 64 px image",
        "the run stops once the best epoch is 10 epochs old",
        "the specification of PML's losses",
        "docs/losses.md and [losses.md](losses.md)",
    ],
)
def test_ordinary_text_is_not_flagged(text):
    assert not violations(text)


# The code, configs and scripts speak to users too: no specification outside the repository
# (they cite docs/), no issue references, no paths of the machine something was measured on.
CODE_FORBIDDEN = {
    "a local path": re.compile(r"(?<![\w.~:/-])/(?:work|root|home|Users)/"),
    "an issue reference": re.compile(r"\bissues? #?\d+\b|\bstop \d+\b|\bDone-when\b", re.IGNORECASE),
    "a mention of the specification outside the repository": re.compile(
        r"\bLOSSES\.md|\bshared/(?:spec|notes)\b|\b[Ss]pec(?:'s)? (?:§ ?)?\d+(?:\.\d+)*"
    ),
}
CODE = sorted(
    path
    for pattern in ("pml_fieldlosses/**/*.py", "tests/**/*.py", "benchmarks/*.py", "scripts/**/*.py",
                    "examples/*.py", "configs/**/*.yaml", "pyproject.toml", ".ci/run")
    for path in ROOT.glob(pattern)
    if path.name != "test_docs.py"
)


def code_violations(text):
    flat = text.replace("\n", " ")
    return sorted(
        (text.count("\n", 0, match.start()) + 1, what, match.group(0))
        for what, pattern in CODE_FORBIDDEN.items()
        for match in pattern.finditer(flat)
    )


def test_code_cites_the_docs_not_the_specification():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {what}: {text!r}"
        for path in CODE
        for number, what, text in code_violations(path.read_text())
    ]
    assert len(CODE) > 100 and not found, "\n".join(found)


def test_each_kind_is_found_in_code():
    spec = "a mention of the specification outside the repository"
    for text, kind in {
        '"""Spec 2.2. x: (B, D)': spec, "# see LOSSES.md": spec, "# the official values (spec 6.4)": spec,
        "# as measured in issue 16": "an issue reference", 'DATA = "/work/data/glyphs"': "a local path",
    }.items():
        assert kind in [what for _, what, _ in code_violations(text)], text


def test_code_words_are_not_flagged():
    assert not code_violations("def parse_registration(spec):\n    specs = [spec]  # a pb spec\ntmp = '/tmp/x'\n")

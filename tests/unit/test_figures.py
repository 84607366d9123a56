"""Every figure the README states is one docs/measured.md states (the one home of figures, each
with the command that measures it), and docs/*.md stay within their size budget.

A figure is what ``FIGURE`` matches: a number, or a range of two (``35-40``), followed by a unit
of time, size or share, or a count of N out of M:

- seconds and milliseconds: ``9.2 s``, ``35-40 s``, ``150 ms``;
- minutes, with the seconds after them: ``2 min 15 s``, ``19 min 6 s``, ``30 min``;
- sizes: ``24.9 MiB``, ``35.5 MB``, ``287 KiB``, ``1.42 GiB``;
- shares: ``60 %``;
- counts: ``10/10``.

The space between number and unit may be missing or a line break. A number run into a word or
another number (``amd64``, ``v1.35.4``, ``2026-12-08``) or a unit run into a word (``10 shoots``,
``30 minutes``) is no figure. Figures are compared with their whitespace removed, so the
README's ``9.2 s`` is measured.md's ``**9.2 s**`` or ``9.2s``. measured.md is read whole: a
figure counts wherever it stands there, in a table row or the text about one.

``ALLOWED`` names the few README figures that are settings rather than measurements, each with
why; every other README figure missing from measured.md fails, naming the figure and its README
line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MEASURED = ROOT / "docs" / "measured.md"

NUMBER = r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?"
FIGURE = re.compile(
    r"(?<![\w.\-/])(?:"
    rf"{NUMBER}\s?min(?:\s\d+(?:\.\d+)?\s?s)?"  # minutes, maybe with seconds: 19 min 6 s
    rf"|{NUMBER}\s?(?:ms|s|KiB|MiB|GiB|MB|%)"  # 9.2 s, 35-40 s, 24.9 MiB, 60 %
    r"|\d+/\d+"  # counts: 10/10
    r")(?![\w/])"
)

# README figures that are settings, not measurements: they need no row in measured.md.
ALLOWED = {
    "40 s": "KCM's node grace period (Gardener's node-monitor grace): the deadline raced, a setting",
    "2 s": "the agents' renew interval, DWD_RENEW_INTERVAL's default: a setting",
}

# The budget of docs/*.md together (the README not counted): a page that grows past it is cut
# back by saying a thing once and linking to it.
DOCS_BUDGET_BYTES = 120_000


@dataclass(frozen=True)
class Figure:
    text: str
    line: int

    @property
    def key(self) -> str:
        return canonical(self.text)


def canonical(figure: str) -> str:
    return re.sub(r"\s+", "", figure)


def figures(text: str) -> list[Figure]:
    """Each figure of ``text`` as written, with the line it starts on."""
    return [
        Figure(" ".join(m.group(0).split()), text.count("\n", 0, m.start()) + 1)
        for m in FIGURE.finditer(text)
    ]


def unmeasured(readme: str, measured: str, allowed: dict[str, str] = ALLOWED) -> list[str]:
    """``README.md:LINE: 'FIGURE' ...`` for each README figure measured.md does not state."""
    known = {f.key for f in figures(measured)} | {canonical(a) for a in allowed}
    lines = readme.splitlines()
    return [
        f"README.md:{f.line}: {f.text!r} is no figure of docs/measured.md (add its row there, "
        f"with the command that measures it): {lines[f.line - 1].strip()}"
        for f in figures(readme)
        if f.key not in known
    ]


def test_every_figure_of_the_readme_is_in_measured_md() -> None:
    readme = README.read_text()
    assert figures(readme), "the README states figures: none found means FIGURE broke"
    missing = unmeasured(readme, MEASURED.read_text())
    assert not missing, "\n".join(missing)


def test_every_allowed_figure_is_still_in_the_readme() -> None:
    stated = {f.key for f in figures(README.read_text())}
    stale = [a for a in ALLOWED if canonical(a) not in stated]
    assert not stale, f"allowed but no longer in the README (drop them from ALLOWED): {stale}"


def test_what_is_a_figure() -> None:
    text = (
        "cut -> KCM at 0 9.2 s, Unknown 35-40 s after it, 10/10 endpoints, 24.9 MiB\n"
        "warm 19 min 6 s, cold 31 min\n38 s, 60 % of 150 ms, 1.42 GiB, 35.5 MB\n"
        "not: amd64, v1.35.4, Go >= 1.26.5, 2026-12-08, 10 shoots, 30 minutes, 100/s, 5000 nodes\n"
    )
    assert [(f.text, f.line) for f in figures(text)] == [
        ("9.2 s", 1),
        ("35-40 s", 1),
        ("10/10", 1),
        ("24.9 MiB", 1),
        ("19 min 6 s", 2),
        ("31 min 38 s", 2),
        ("60 %", 3),
        ("150 ms", 3),
        ("1.42 GiB", 3),
        ("35.5 MB", 3),
    ]


def test_a_drifted_figure_is_named_with_its_line() -> None:
    measured = "| cut → KCM at 0 | **9.2 s**, 10/10 endpoints | `make demo` |\n"
    readme = "# x\n\nKCM at 0 9.2 s after the cut, every 2 s a renewal,\n10/10 kept; then 9.3 s.\n"
    assert unmeasured(readme, measured) == [
        "README.md:4: '9.3 s' is no figure of docs/measured.md (add its row there, with the "
        "command that measures it): 10/10 kept; then 9.3 s."
    ]
    assert unmeasured(readme, measured, allowed={}) != []  # "2 s" counts once it is not allowed


def test_the_docs_stay_within_their_budget() -> None:
    sizes = {p.name: p.stat().st_size for p in sorted((ROOT / "docs").glob("*.md"))}
    total = sum(sizes.values())
    assert total <= DOCS_BUDGET_BYTES, (
        f"docs/*.md are {total} bytes, over the budget of {DOCS_BUDGET_BYTES}: say a thing once "
        f"and link to it ({', '.join(f'{n} {s}' for n, s in sorted(sizes.items(), key=lambda x: -x[1]))})"
    )

"""Every relative link in the README and docs/ reaches a file that exists, and an anchor a
heading of that file makes (GitHub's rule): a section moved between pages leaves no dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        into = (page.parent / path).resolve() if path else page
        if not into.exists():
            dead.append(f"{target}: no such file")
        elif anchor and into.suffix == ".md" and anchor not in anchors(into):
            dead.append(f"{target}: no such heading in {into.name}")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    assert dead_links(page) == []


def test_a_dead_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## A section\n\n[ok](#a-section) [gone](#b) [file](nowhere.md)\n")
    assert dead_links(page) == ["#b: no such heading in page.md", "nowhere.md: no such file"]


def test_every_alert_has_a_runbook_section() -> None:
    rules = yaml.safe_load((ROOT / "manifests" / "monitoring" / "prometheusrule.yaml").read_text())
    alerts = [r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r]
    runbook = anchors(ROOT / "docs" / "runbook.md")
    for alert in alerts:
        url = alert["annotations"].get("runbook_url", "")
        path, _, anchor = url.partition("#")
        assert path == "docs/runbook.md" and anchor in runbook, (alert["alert"], url)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_table_has_its_header(page: Path) -> None:
    lines = page.read_text().splitlines()
    broken = [
        lines[i]
        for i in range(len(lines))
        if lines[i].startswith("|")
        and (i == 0 or not lines[i - 1].startswith("|"))
        and not (i + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+\|", lines[i + 1].strip()))
    ]
    assert broken == [], "a table row with no header (a blank line split its table?)"

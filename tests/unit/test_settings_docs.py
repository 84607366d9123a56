"""Every variable's default is written once, in its settings field (core.config.var); the
docs/settings.md's tables and docs/design.md's say the same, or this fails naming the row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent.settings import Settings as AgentSettings
from aggregator.model.settings import (
    DeciderSettings,
    LeaderSettings,
    ProvisionSettings,
    ScaleSettings,
    ShootSettings,
)
from core.config import Var, variables
from core.durations import parse_duration

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "settings.md", ROOT / "docs" / "design.md")
AGGREGATOR = (DeciderSettings, LeaderSettings, ProvisionSettings, ScaleSettings, ShootSettings)


def rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(variables, defaults) of every table row whose first cell names DWD_ variables."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`DWD_"):
            continue
        names = re.findall(r"`(DWD_[A-Z_]+)`", cells[0])
        defaults = [d.strip() for d in re.split(r",\s*(?=`)|\s+/\s+", cells[1])]
        out.append((names, defaults))
    return out


def documented(paths: tuple[Path, ...] = DOCS) -> dict[str, list[tuple[str, str]]]:
    """Variable -> every (where, default as written) the docs give it."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in paths:
        for names, defaults in rows(path.read_text()):
            for i, name in enumerate(names):
                written = defaults[i] if len(defaults) == len(names) else defaults[0]
                out.setdefault(name, []).append((path.name, written))
    return out


def agrees(written: str, default: Any, v: Var) -> bool:
    """Whether a table's default says the field's. Words (a path described, "empty = off")
    stand for a string field only; anything else is a value of the field's kind."""
    quoted = re.fullmatch(r"`([^`]*)`.*", written)
    text = quoted.group(1) if quoted else written
    if v.kind == "string":
        return text == default if quoted else True
    if v.kind == "boolean":
        return text == str(default).lower()
    number = re.match(r"([\d.]+)\s*(ms|s|m|h)?\b", text)
    if number is None:
        return False
    if v.kind == "duration":
        return bool(parse_duration(number.group(1) + (number.group(2) or "s")) == default)
    return float(number.group(1)) == float(default)


FIELDS = [(cls, f, v) for cls in (*AGGREGATOR, AgentSettings) for f, v in variables(cls)]


@pytest.mark.parametrize(("cls", "f", "v"), FIELDS, ids=[f"{c.__name__}.{f.name}" for c, f, _ in FIELDS])
def test_every_documented_default_is_the_fields(cls: type, f: Any, v: Var) -> None:
    where = documented().get(v.name)
    assert where, f"{v.name} ({cls.__name__}.{f.name}) is in no table of docs/settings.md"
    for doc, written in where:
        assert agrees(written, f.default, v), f"{doc}: {v.name} says {written}, the field {f.default!r}"


def test_the_check_catches_a_default_that_drifted(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "| variable | default | why |\n|---|---|---|\n| `DWD_LEASE_DURATION` | `9s` | |\n"
        "| `DWD_LEADER_LEASE_DURATION`, `DWD_LEADER_RENEW_DEADLINE` | `15s`, `11s` | |\n"
        "| `DWD_FAILURE_FRACTION` / `DWD_RECOVERY_FRACTION` | 0.6 / 0.4 | |\n"
    )
    where = documented((readme,))
    by_name = {v.name: (f, v) for _, f, v in FIELDS}
    verdicts = {
        name: all(agrees(w, by_name[name][0].default, by_name[name][1]) for _, w in where[name])
        for name in where
    }
    assert verdicts == {
        "DWD_LEASE_DURATION": False,
        "DWD_LEADER_LEASE_DURATION": True,
        "DWD_LEADER_RENEW_DEADLINE": False,
        "DWD_FAILURE_FRACTION": True,
        "DWD_RECOVERY_FRACTION": True,
    }

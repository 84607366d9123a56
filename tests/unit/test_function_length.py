"""No function longer than 50 lines in the programs, the harness, the benches, the demo and the
fault suite: a longer one holds more than one step, and each step deserves a name
(docs/harness.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("aggregator", "agent", "core", "testenv", "bench", "demo", "image", "tests/soak")
MAX_LINES = 50


def too_long(source: str, max_lines: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function in ``source`` longer than ``max_lines``,
    its decorators excluded, its docstring included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > max_lines:
                out.append((node.name, node.lineno, lines))
    return sorted(out, key=lambda found: found[1])


def test_no_function_is_longer_than_fifty_lines() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} {name} ({lines} lines)"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "go" not in path.relative_to(ROOT).parts
        for name, line, lines in too_long(path.read_text())
    ]
    assert not found, "split into named steps:\n" + "\n".join(found)


def test_the_check_sees_a_long_method_and_a_nested_function() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(50))
    source = f"class A:\n    def short(self):\n        pass\n\n    async def long(self):\n{body}\n"
    source += "\ndef outer():\n    def inner():\n" + "\n".join(f"        y{i} = {i}" for i in range(50))
    assert too_long("def f():\n" + "".join(f"    x = {i}\n" for i in range(49))) == []  # exactly 50
    assert [(name, lines) for name, _, lines in too_long(source)] == [
        ("long", 51),
        ("outer", 52),
        ("inner", 51),
    ]

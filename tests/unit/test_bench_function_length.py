"""No function in bench/ is longer than 50 lines (its def line to its last, inclusive)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 50


def long_functions(root: Path, package: str) -> list[str]:
    out = []
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT - 2))
    code = f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{body}\n        return 0\n"
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "m.py").write_text(code)
    assert long_functions(tmp_path, "p") == []  # exactly the limit
    (tmp_path / "p" / "m.py").write_text(code.replace("return 0", "x = 1\n        return 0"))
    assert long_functions(tmp_path, "p") == [f"p/m.py:6 long ({LIMIT + 1} lines)"]


def test_no_function_in_bench_is_over_50_lines() -> None:
    assert long_functions(ROOT, "bench") == []

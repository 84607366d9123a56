from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
# A column of a table whose columns are data: its header, and the cell it makes of an item.
Column = tuple[str, Callable[[T], object]]


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [list(map(str, header)), *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n## {title}\n")
    for i, row in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def print_columns(
    title: str, columns: Sequence[tuple[str, Callable[[T], object]]], items: Iterable[T]
) -> None:
    """A table whose columns are data: each its header and the cell it makes of an item, a
    row per item."""
    print_table(title, [h for h, _ in columns], [[cell(x) for _, cell in columns] for x in items])

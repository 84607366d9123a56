"""The demo on a terminal: a board of both worlds, redrawn in place, instead of a line per sample;
what the acts say scrolls above it. ``board`` is a pure function of the tracks and the time."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from demo.track import Sample, Track
from testenv.kube.controllers import CONTROLLERS, KCM

BARS = "▁▂▃▄▅▆▇█"
# A sparkline's character spans this many seconds: the last minute or so on a line.
CELL_S = 2.0
TITLE = 18
# Room for " 10/10" after a sparkline, and between the columns.
VALUE, SPACE = 6, 4

Row = tuple[str, Callable[[Sample], int], Callable[[Sample], int], bool]
ROWS: tuple[Row, ...] = (
    ("leases renewed", lambda s: s.leases_renewed, lambda s: s.leases, True),
    ("KCM replicas", lambda s: s.kcm, lambda s: CONTROLLERS[KCM], False),
    ("nodes Unknown", lambda s: s.nodes_unknown, lambda s: s.nodes, True),
    ("ready endpoints", lambda s: s.endpoints, lambda s: s.nodes, True),
)


def board(tracks: Sequence[Track], now: float, width: int) -> list[str]:
    """The board's lines, none wider than ``width``: a column per world, a row per series, each
    a sparkline of the last seconds (a character per ``CELL_S``) and the value now."""
    spark = max(6, min(30, (width - TITLE) // max(1, len(tracks)) - VALUE - SPACE))
    column = spark + VALUE + SPACE
    lines = [" " * TITLE + "".join(f"{t.label[: column - 1]:{column}}" for t in tracks)]
    lines.append(f"{'':{TITLE}}" + "".join(f"{_clock(t, now)[: column - 1]:{column}}" for t in tracks))
    for title, value, total, of_total in ROWS:
        cells = []
        for t in tracks:
            samples = list(t.samples)
            if not samples:
                cells.append(f"{'':{column}}")
                continue
            last = samples[-1]
            top = max([total(last), *(value(s) for s in samples)])
            shown = f"{value(last)}/{total(last)}" if of_total else str(value(last))
            cells.append(f"{sparkline(samples, value, top, now, spark)}{shown:>{VALUE}}{'':{SPACE}}")
        lines.append(f"{title:{TITLE}}" + "".join(cells))
    return [line.rstrip()[:width] for line in lines]


def _clock(track: Track, now: float) -> str:
    since = track.since_cut(now)
    if since is None:
        return "before the cut"
    heal = track.marks.get("heal")
    healed = "" if heal is None else f" heal +{heal - track.marks['cut']:.0f}s"
    return f"cut +{since:.0f}s{healed}"


def sparkline(
    samples: Sequence[Sample], value: Callable[[Sample], int], top: int, now: float, cells: int
) -> str:
    """``cells`` characters, the last one ending at ``now``: each the last value sampled by the
    end of its ``CELL_S``, blank before the first sample."""
    out = []
    i = 0
    for c in range(cells):
        end = now - (cells - 1 - c) * CELL_S
        while i < len(samples) and samples[i].at <= end:
            i += 1
        if i == 0:
            out.append(" ")
        else:
            out.append(BARS[round(value(samples[i - 1]) / max(1, top) * (len(BARS) - 1))])
    return "".join(out)


class Live:
    """The board at the bottom of the terminal, drawn again over itself (an ANSI cursor-up and
    erase), at most every ``every_s``; a line said is written above it. Both acts call it from
    threads of their own."""

    def __init__(self, out: TextIO, tracks: Sequence[Track], every_s: float = 0.25) -> None:
        self.out, self.tracks, self.every_s = out, tracks, every_s
        self.lock = threading.Lock()
        self.drawn = 0  # lines of the board on the screen now
        self.last = -float("inf")
        self.closed = False

    def say(self, line: str) -> None:
        with self.lock:
            self._write(line, board=not self.closed)

    def update(self) -> None:
        with self.lock:
            if not self.closed and time.monotonic() - self.last >= self.every_s:
                self._write("", board=True)

    def close(self) -> None:
        """The last board left in place; what is said next goes below it."""
        with self.lock:
            if not self.closed:
                self._write("", board=True)
                self.closed, self.drawn = True, 0

    def _write(self, line: str, *, board: bool) -> None:
        text = f"\x1b[{self.drawn}A\x1b[J" if self.drawn else ""
        text += line
        if board:
            lines = render(self.tracks, time.monotonic())
            text += "".join(f"{row}\n" for row in lines)
            self.drawn, self.last = len(lines), time.monotonic()
        self.out.write(text)
        self.out.flush()


def render(tracks: Sequence[Track], now: float) -> list[str]:
    """The board framed for a terminal of this width (a line as wide would wrap, and the
    cursor-up that redraws it would count one line short)."""
    # A terminal that reports no size (a bare pty) reads as 0 columns.
    width = max(60, shutil.get_terminal_size((100, 24)).columns - 1)
    lines = board(tracks, now, width)
    rule = "─" * max(len(line) for line in lines)
    return [rule, *lines, rule]

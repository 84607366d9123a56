"""The race as a picture: each world's track (demo/track.py) in a column of its own, on one time
axis from the cut, a chart per row (its agents' leases renewed, KCM's replicas, its nodes
Unknown, its ready endpoints), with the cut, the heal and KCM at 0 marked. A self-contained SVG
built as text: a browser shows it, and each series carries a ``<title>`` of its changes."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from demo.track import Sample, Track

# The canvas, in pixels: the row titles on the left, then a column per world.
LEFT, COLUMN, GAP, RIGHT = 150, 360, 50, 30
TOP, ROW, CHART = 150, 90, 64
# How much of the time before the cut is shown: the calm the cut breaks.
BEFORE_S = 10.0
GREY = "#777777"


@dataclass(frozen=True)
class Row:
    title: str
    value: Callable[[Sample], int]
    color: str
    # The value at the top of the chart: every node, or the most KCM replicas seen.
    top: Callable[[Sequence[Sample]], int]


def _nodes(samples: Sequence[Sample]) -> int:
    return max((s.nodes for s in samples), default=1)


def _kcm_top(samples: Sequence[Sample]) -> int:
    return max([1, *(s.kcm for s in samples)])


ROWS = (
    Row("leases renewed", lambda s: s.leases_renewed, "#1f77b4", _nodes),
    Row("KCM replicas", lambda s: s.kcm, "#9467bd", _kcm_top),
    Row("nodes Unknown", lambda s: s.nodes_unknown, "#d62728", _nodes),
    Row("ready endpoints", lambda s: s.endpoints, "#2ca02c", _nodes),
)
# The marks drawn (the act's name, the picture's), their labels stacked above a column in this order.
MARKS = (("cut", "cut", "#333333"), ("all_down", "KCM at 0", "#9467bd"), ("heal", "heal", "#2ca02c"))
BOTTOM = TOP + (len(ROWS) - 1) * ROW + CHART
LEGEND = (
    "cut: the load balancer in front of the shoot's API server closed (the API server itself fine)"
    " · KCM at 0: every controller scaled down · heal: the load balancer back"
)


def el(tag: str, body: str | None = None, /, **attrs: object) -> str:
    """An element; ``font_size`` is written ``font-size``, floats with a decimal."""
    text = "".join(
        f" {k.rstrip('_').replace('_', '-')}={quoteattr(f'{v:.1f}' if isinstance(v, float) else str(v))}"
        for k, v in attrs.items()
    )
    return f"<{tag}{text}/>" if body is None else f"<{tag}{text}>{body}</{tag}>"


@dataclass(frozen=True)
class Axis:
    """Seconds from the cut, on a column ``COLUMN`` pixels wide."""

    start_s: float
    end_s: float

    def x(self, left: float, t: float) -> float:
        return left + (min(max(t, self.start_s), self.end_s) - self.start_s) / self.span * COLUMN

    @property
    def span(self) -> float:
        return self.end_s - self.start_s

    def ticks(self) -> list[int]:
        step = 10 if self.span <= 150 else 20
        return list(range(math.ceil(self.start_s / step) * step, int(self.end_s) + 1, step))


def origin(track: Track) -> float:
    """Where the track's time axis starts: its cut (its first sample, had it none)."""
    return track.marks.get("cut", track.samples[0].at if track.samples else 0.0)


def axis_of(tracks: Sequence[Track]) -> Axis:
    """From a little before the cut to the last sample of the longer world, rounded up to 10 s."""
    ends = [track.samples[-1].at - origin(track) for track in tracks if track.samples]
    return Axis(-BEFORE_S, max(10.0, math.ceil(max(ends, default=0.0) / 10) * 10))


def svg(tracks: Sequence[Track], summary: str = "") -> str:
    """The picture of ``tracks`` side by side; ``summary`` is written under the title."""
    axis = axis_of(tracks)
    width = LEFT + len(tracks) * COLUMN + (len(tracks) - 1) * GAP + RIGHT
    legend = textwrap.wrap(LEGEND, 140)
    height = BOTTOM + 66 + 16 * len(legend)
    title = "The same cut of the load balancer, without protection and with it"
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='DejaVu Sans, Helvetica, Arial, sans-serif' "
        "font-size='12'>",
        el("title", escape(f"dwd-lease demo: {title}")),
        el("rect", width=width, height=height, fill="white"),
        el("text", escape(title), x=20, y=30, font_size=18, font_weight="bold"),
        *(
            el("text", escape(line), x=20, y=54 + 16 * i)
            for i, line in enumerate(textwrap.wrap(summary, 150))
        ),
        *(
            el(
                "text",
                row.title,
                x=LEFT - 40,
                y=TOP + r * ROW + CHART // 2 + 4,
                text_anchor="end",
                fill=row.color,
            )
            for r, row in enumerate(ROWS)
        ),
    ]
    for i, track in enumerate(tracks):
        parts += Column(track, axis, LEFT + i * (COLUMN + GAP)).draw()
    parts += [
        el("text", escape(line), x=20, y=BOTTOM + 66 + 16 * i, fill=GREY) for i, line in enumerate(legend)
    ]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Column:
    """A world's charts, its marks above and across them, and the time axis below."""

    track: Track
    axis: Axis
    left: float

    def x(self, at: float) -> float:
        """The x of a moment (time.monotonic())."""
        return self.axis.x(self.left, at - origin(self.track))

    def draw(self) -> list[str]:
        samples = list(self.track.samples)
        out = [
            f"<g class='world' data-world={quoteattr(self.track.label)}>",
            el("text", escape(self.track.label), x=self.left, y=TOP - 52, font_size=15, font_weight="bold"),
        ]
        for r, row in enumerate(ROWS):
            out += self._chart(row, samples, TOP + r * ROW)
        return [*out, *self._outage(), *self._marks(), *self._time_axis(), "</g>"]

    def _outage(self) -> list[str]:
        """The time the load balancer was cut, shaded over the charts."""
        marks = self.track.marks
        if "cut" not in marks:
            return []
        x0, x1 = self.x(marks["cut"]), self.x(marks.get("heal", math.inf))
        return [el("rect", x=x0, y=TOP, width=x1 - x0, height=BOTTOM - TOP, fill="#d62728", opacity=0.07)]

    def _chart(self, row: Row, samples: list[Sample], top: float) -> list[str]:
        peak = row.top(samples)
        points = steps([(s.at - origin(self.track), row.value(s)) for s in samples], self.axis)
        bottom = top + CHART
        out = [
            el("rect", x=self.left, y=top, width=COLUMN, height=CHART, fill="#f6f6f6"),
            el("text", "0", x=self.left - 4, y=bottom, text_anchor="end", font_size=10, fill=GREY),
            el("text", str(peak), x=self.left - 4, y=top + 9, text_anchor="end", font_size=10, fill=GREY),
        ]
        if points:
            xy = [(self.axis.x(self.left, t), bottom - v / peak * CHART) for t, v in points]
            line = path(xy)
            out.append(el("path", d=f"{line}V{bottom:.1f}H{xy[0][0]:.1f}Z", fill=row.color, opacity=0.15))
            tooltip = el("title", escape(changes(row.title, points)))
            attrs = {"class_": "series", "data_series": row.title, "stroke": row.color, "stroke_width": 2}
            out.append(el("path", tooltip, d=line, fill="none", **attrs))
        return out

    def _marks(self) -> list[str]:
        """A dashed line down the column at each mark, its label stacked above the charts."""
        out = []
        for i, (name, label, color) in enumerate(MARKS):
            at = self.track.marks.get(name)
            if at is None:
                continue
            x = self.x(at)
            text = label if name == "cut" else f"{label} {at - origin(self.track):+.1f}s"
            y = TOP - 36 + 12 * i
            dashed = {"stroke": color, "stroke_width": 1.5, "stroke_dasharray": "4 3"}
            out.append(el("line", class_="mark", data_mark=label, x1=x, y1=y, x2=x, y2=BOTTOM, **dashed))
            out.append(el("text", escape(text), x=x + 3, y=y - 2, font_size=11, fill=color))
        return out

    def _time_axis(self) -> list[str]:
        left, y = self.left, BOTTOM
        out = [el("line", x1=left, y1=y, x2=left + COLUMN, y2=y, stroke="#999999")]
        for t in self.axis.ticks():
            x = self.axis.x(left, t)
            out.append(el("line", x1=x, y1=y, x2=x, y2=y + 4, stroke="#999999"))
            out.append(el("text", str(t), x=x, y=y + 16, text_anchor="middle", font_size=10))
        middle = left + COLUMN / 2
        out.append(el("text", "seconds from the cut", x=middle, y=y + 32, text_anchor="middle", fill=GREY))
        return out


def steps(points: list[tuple[float, int]], axis: Axis) -> list[tuple[float, int]]:
    """The changes of a series (seconds from the cut, value) within the axis: its value as the
    axis starts (the last one sampled before), each change, and its last sample."""
    before = [p for p in points if p[0] <= axis.start_s]
    shown = ([(axis.start_s, before[-1][1])] if before else []) + [
        p for p in points if axis.start_s < p[0] <= axis.end_s
    ]
    kept = [p for i, p in enumerate(shown) if i == 0 or p[1] != shown[i - 1][1]]
    if shown and kept[-1] != shown[-1]:
        kept.append(shown[-1])
    return kept


def path(xy: list[tuple[float, float]]) -> str:
    """A step line through ``xy``: each value holds until the next."""
    return f"M{xy[0][0]:.1f},{xy[0][1]:.1f}" + "".join(f"H{x:.1f}V{y:.1f}" for x, y in xy[1:])


def changes(title: str, points: list[tuple[float, int]]) -> str:
    """A series' tooltip: each value and from when (the last point only ends the series)."""
    changed = [p for i, p in enumerate(points) if i == 0 or p[1] != points[i - 1][1]]
    return f"{title}: " + ", ".join(f"{v} from {t:+.1f}s" for t, v in changed)

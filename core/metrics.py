"""A small Prometheus registry: counters, gauges and histograms with labels, text exposition 0.0.4.

Small enough for the agent, which runs on every node and should not carry a
client library and its threads for four numbers; the aggregator uses the same.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(labels)
        self._values: dict[tuple[str, ...], float] = {}

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def get(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def remove_matching(self, **labels: str) -> None:
        idx = [(self.label_names.index(k), v) for k, v in labels.items()]
        for key in [k for k in self._values if all(k[i] == v for i, v in idx)]:
            del self._values[key]

    def samples(self) -> list[tuple[tuple[str, ...], float]]:
        return sorted(self._values.items())

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for key, value in self.samples():
            if key:
                pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.label_names, key, strict=True))
                lines.append(f"{self.name}{{{pairs}}} {_fmt(value)}")
            else:
                lines.append(f"{self.name} {_fmt(value)}")
        return "\n".join(lines)


class Counter(_Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0, /, **labels: str) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(_Metric):
    kind = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        fn: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(name, help_text, labels)
        self._fn = fn

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = float(value)

    def set_function(self, fn: Callable[[], float]) -> None:
        """Read the value at scrape time (an unlabelled gauge)."""
        self._fn = fn

    def samples(self) -> list[tuple[tuple[str, ...], float]]:
        if self._fn is not None:
            return [((), self._fn())]
        return super().samples()


class Histogram(_Metric):
    """Cumulative buckets, a sum and a count per label set, as Prometheus expects them."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[tuple[str, ...], list[float]] = {}  # per-bucket counts, then +Inf, sum

    def observe(self, value: float, **labels: str) -> None:
        series = self._series.setdefault(self._key(labels), [0.0] * (len(self.buckets) + 2))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                series[i] += 1
        series[-2] += 1
        series[-1] += value

    def count(self, **labels: str) -> float:
        series = self._series.get(self._key(labels))
        return series[-2] if series else 0.0

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for key, series in sorted(self._series.items()):
            pairs = [f'{n}="{_escape(v)}"' for n, v in zip(self.label_names, key, strict=True)]
            bounds = [*(_fmt(b) for b in self.buckets), "+Inf"]
            for bound, value in zip(bounds, series, strict=False):
                labels = ",".join([*pairs, f'le="{bound}"'])
                lines.append(f"{self.name}_bucket{{{labels}}} {_fmt(value)}")
            suffix = "{" + ",".join(pairs) + "}" if pairs else ""
            lines.append(f"{self.name}_sum{suffix} {_fmt(series[-1])}")
            lines.append(f"{self.name}_count{suffix} {_fmt(series[-2])}")
        return "\n".join(lines)


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        c = Counter(name, help_text, labels)
        self._add(c)
        return c

    def gauge(
        self, name: str, help_text: str, labels: Sequence[str] = (), fn: Callable[[], float] | None = None
    ) -> Gauge:
        g = Gauge(name, help_text, labels, fn)
        self._add(g)
        return g

    def histogram(
        self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        h = Histogram(name, help_text, labels, buckets)
        self._add(h)
        return h

    def labelled(self, label: str) -> list[_Metric]:
        """Every metric that has ``label``: what a caller forgets a label value from."""
        return [m for m in self._metrics.values() if label in m.label_names]

    def render(self) -> str:
        return "\n".join(m.render() for m in self._metrics.values()) + "\n"


# Connections served at once; beyond, a new one is closed at once. Prometheus needs one; a
# client that opens hundreds and sends nothing must not hold the agent's memory or its loop.
MAX_CONNECTIONS = 8


async def serve_metrics(
    registry: Registry, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS
) -> asyncio.Server:
    """A minimal HTTP/1.0 endpoint for /metrics (and /healthz) without a web framework: one
    request a connection, its head within 5 s and 64 KiB, ``max_connections`` at once."""
    open_now = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now
        if open_now >= max_connections:
            writer.close()
            return
        open_now += 1
        try:
            await _answer(registry, reader, writer)
        finally:
            open_now -= 1

    return await asyncio.start_server(handle, host, port)


async def _answer(registry: Registry, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
        if path.startswith(b"/metrics"):
            status, ctype, body = "200 OK", CONTENT_TYPE, registry.render().encode()
        elif path.startswith(b"/healthz"):
            status, ctype, body = "200 OK", "text/plain", b"ok\n"
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
        head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()

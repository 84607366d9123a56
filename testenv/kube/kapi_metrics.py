"""What kube-apiserver says about the requests it served: its /metrics (Prometheus' text
format, the request counters and the latency histogram). Who sent them is in its audit log
(testenv/kube/audit.py)."""

from __future__ import annotations

import math
import re
import ssl
from collections.abc import Iterable

import httpx

from testenv.kube.controlplane import ControlPlane

# -- Prometheus' text format

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Series = list[tuple[str, dict[str, str], float]]
REQUESTS = "apiserver_request_total"
DURATIONS = "apiserver_request_duration_seconds_bucket"


def parse_metrics(text: str, names: Iterable[str]) -> Series:
    """The samples of the metrics whose names start with one of ``names``: (name, labels,
    value). Label values are kept as written (escapes not undone)."""
    wanted = tuple(names)
    out = []
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def _matches(ls: dict[str, str], labels: dict[str, str]) -> bool:
    return all(ls.get(k) == w for k, w in labels.items())


def total(series: Series, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry every one of ``labels``."""
    return sum(v for n, ls, v in series if n == name and _matches(ls, labels))


def requests(
    s: Series, verb: str | None = None, resource: str | None = None, code: str | None = None
) -> float:
    """apiserver_request_total for a verb, resource and code (any, where None)."""
    labels = {k: v for k, v in (("verb", verb), ("resource", resource), ("code", code)) if v is not None}
    return total(s, REQUESTS, **labels)


def _buckets(series: Series, name: str, labels: dict[str, str]) -> dict[float, float]:
    out: dict[float, float] = {}
    for n, ls, v in series:
        if n == name and _matches(ls, labels):
            le = float(ls["le"])
            out[le] = out.get(le, 0.0) + v
    return out


def histogram_quantile(
    before: Series, after: Series, q: float, name: str = DURATIONS, **labels: str
) -> float | None:
    """The q-quantile of a histogram's observations between two scrapes, interpolated within
    its bucket as Prometheus' histogram_quantile does (None without observations)."""
    b0, b1 = _buckets(before, name, labels), _buckets(after, name, labels)
    cum = sorted((le, b1[le] - b0.get(le, 0.0)) for le in b1)
    if not cum or cum[-1][1] <= 0:
        return None
    rank = q * cum[-1][1]
    lower_le, lower_n = 0.0, 0.0
    for le, n in cum:
        if n >= rank:
            if math.isinf(le):
                return lower_le
            return lower_le + (le - lower_le) * (rank - lower_n) / max(n - lower_n, 1e-9)
        lower_le, lower_n = le, n
    return None


class Kapi:
    """kube-apiserver's /metrics and the pids of its processes."""

    NAMES = (REQUESTS, DURATIONS)

    def __init__(self, plane: ControlPlane) -> None:
        tls = ssl.create_default_context(cafile=str(plane.ca_file))
        tls.load_cert_chain(str(plane.admin.cert), str(plane.admin.key))
        self.http = httpx.Client(base_url=plane.url, verify=tls, trust_env=False, timeout=30)
        # _procs: the names matter (etcd, kube-apiserver), pids() has only numbers.
        self.pids = {p.name: p.popen.pid for p in plane._procs}

    def scrape(self) -> Series:
        return parse_metrics(self.http.get("/metrics").text, self.NAMES)

    def close(self) -> None:
        self.http.close()

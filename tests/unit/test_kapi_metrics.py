"""testenv/kube/kapi_metrics.py: Prometheus' text format as kube-apiserver writes it, the request
counters and latency histogram read from two scrapes; testenv/kube/audit.py: audit-log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testenv.kube.audit import Audit, audit_key
from testenv.kube.kapi_metrics import DURATIONS, REQUESTS, histogram_quantile, parse_metrics, requests, total

TEXT = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",resource="leases",verb="PATCH"} 12
apiserver_request_total{code="404",component="apiserver",resource="leases",verb="PATCH"} 3
apiserver_request_total{code="201",component="apiserver",resource="leases",verb="POST"} 5
apiserver_request_total{code="200",component="apiserver",resource="nodes",verb="LIST"} 2.5e+01
apiserver_request_total_other{verb="PATCH"} 99
process_cpu_seconds_total 4.75
go_info{version="go1.22"} 1
weird{path="/a\\"b,c",empty=""} 7
"""


def test_parse_keeps_the_wanted_names_and_their_labels() -> None:
    series = parse_metrics(TEXT, [REQUESTS, "process_cpu", "weird"])
    assert series[0] == (
        REQUESTS,
        {"code": "200", "component": "apiserver", "resource": "leases", "verb": "PATCH"},
        12.0,
    )
    assert [n for n, _, _ in series] == [REQUESTS] * 4 + ["apiserver_request_total_other"] + [
        "process_cpu_seconds_total",
        "weird",
    ]
    assert series[3][2] == 25.0
    assert series[5] == ("process_cpu_seconds_total", {}, 4.75)
    # A quote escaped inside a value, and a comma, stay in it (the escape as written).
    assert series[6] == ("weird", {"path": '/a\\"b,c', "empty": ""}, 7.0)


def test_parse_skips_comments_and_names_not_asked_for() -> None:
    assert parse_metrics(TEXT, ["go_"]) == [("go_info", {"version": "go1.22"}, 1.0)]
    assert parse_metrics(TEXT, ["# HELP"]) == []
    assert parse_metrics("", [REQUESTS]) == []


def test_total_and_requests_sum_over_the_labels_left_open() -> None:
    series = parse_metrics(TEXT, [REQUESTS])
    assert total(series, REQUESTS) == 45.0  # not apiserver_request_total_other
    assert total(series, REQUESTS, verb="PATCH") == 15.0
    assert requests(series, "PATCH", "leases") == 15.0
    assert requests(series, "PATCH", "leases", "404") == 3.0
    assert requests(series, "POST") == 5.0
    assert requests(series) == 45.0
    assert requests(series, "DELETE", "leases") == 0.0


def _histogram(counts: dict[str, float], verb: str = "PATCH") -> str:
    return "".join(
        f'{DURATIONS}{{resource="leases",verb="{verb}",le="{le}"}} {n}\n' for le, n in counts.items()
    )


BEFORE = parse_metrics(_histogram({"0.1": 1, "0.5": 2, "+Inf": 2}), [DURATIONS])
AFTER = parse_metrics(
    _histogram({"0.1": 3, "0.5": 7, "+Inf": 8}) + _histogram({"0.1": 0, "0.5": 0, "+Inf": 50}, "GET"),
    [DURATIONS],
)


def test_histogram_quantile_interpolates_within_the_bucket_between_scrapes() -> None:
    # Between the scrapes: 2 observations <= 0.1 s, 5 <= 0.5 s, 6 in all.
    assert histogram_quantile(BEFORE, AFTER, 0.25, verb="PATCH") == pytest.approx(0.075)
    assert histogram_quantile(BEFORE, AFTER, 0.5, verb="PATCH") == pytest.approx(0.1 + 0.4 / 3)
    # In the +Inf bucket: its lower bound, as Prometheus does.
    assert histogram_quantile(BEFORE, AFTER, 0.99, verb="PATCH") == 0.5
    # GET's 50 observations are all above 0.5 s.
    assert histogram_quantile([], AFTER, 0.5, verb="GET") == 0.5


def test_histogram_quantile_without_observations_is_none() -> None:
    assert histogram_quantile(AFTER, AFTER, 0.5, verb="PATCH") is None
    assert histogram_quantile(BEFORE, AFTER, 0.5, verb="DELETE") is None
    assert histogram_quantile([], [], 0.5) is None


def test_audit_key_by_resource_or_path() -> None:
    lease = {"verb": "patch", "objectRef": {"resource": "leases", "name": "n1"}, "requestURI": "/apis/x"}
    assert audit_key(json.dumps(lease)) == "patch leases"
    assert audit_key(json.dumps({"verb": "get", "requestURI": "/healthz?timeout=5s"})) == "get /healthz"
    version = {"verb": "get", "objectRef": None, "requestURI": "/version"}
    assert audit_key(json.dumps(version)) == "get /version"
    assert audit_key(b'{"verb": "list", "objectRef": {"resour') is None


def test_audit_counts_the_requests_since_a_mark(tmp_path: Path) -> None:
    log = Audit(tmp_path / "audit.log")
    assert log.mark() == 0
    events = [
        {"verb": "patch", "objectRef": {"resource": "leases"}},
        {"verb": "patch", "objectRef": {"resource": "leases"}},
        {"verb": "get", "requestURI": "/healthz"},
    ]
    log.path.write_text("".join(json.dumps(e) + "\n" for e in events))
    mark = log.mark()
    with open(log.path, "a") as f:
        f.write(json.dumps({"verb": "create", "objectRef": {"resource": "leases"}}) + "\n")
        f.write(json.dumps({"verb": "patch", "objectRef": {"resource": "leases"}}) + "\n")
        f.write('{"verb": "delete", "obj')  # being written
    assert log.since(0) == {"patch leases": 3, "get /healthz": 1, "create leases": 1}
    assert log.since(mark) == {"create leases": 1, "patch leases": 1}

from __future__ import annotations

from bench.seed import BLOCKED, refusals, refusals_text
from testenv.kube.kapi_metrics import parse_metrics

BEFORE = """# HELP dwd_scale_down_blocked_total Scale-downs an interlock stopped.
# TYPE dwd_scale_down_blocked_total counter
dwd_scale_down_blocked_total{target="a",reason="kapi_probe_failed"} 1
dwd_scale_down_blocked_total{target="b",reason="watch_stale"} 2
dwd_scale_down_blocked_total_other{target="a",reason="kapi_probe_failed"} 9
"""
AFTER = """dwd_scale_down_blocked_total{target="a",reason="kapi_probe_failed"} 3
dwd_scale_down_blocked_total{target="b",reason="watch_stale"} 2
dwd_scale_down_blocked_total{target="b",reason="kapi_probe_failed"} 1
dwd_scale_down_blocked_total{target="c",reason="some_new_reason"} 4
"""


def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [s for s in parse_metrics(text, [BLOCKED]) if s[0] == BLOCKED]


def test_refusals_are_what_grew_by_reason_and_target() -> None:
    assert refusals(series(BEFORE), series(AFTER)) == {
        "kapi_probe_failed": {"a": 2.0, "b": 1.0},
        "some_new_reason": {"c": 4.0},
    }


def test_replicas_samples_are_summed() -> None:
    after = series(AFTER) + series('dwd_scale_down_blocked_total{target="b",reason="watch_stale"} 1\n')
    assert refusals(series(BEFORE), after)["watch_stale"] == {"b": 1.0}


def test_text_gives_totals_distinct_targets_and_each_cut() -> None:
    cuts = [
        {"kapi_probe_failed": {"a": 2.0, "b": 1.0}},
        {"kapi_probe_failed": {"a": 1.0}, "watch_stale": {"c": 1.0}},
    ]
    assert refusals_text(cuts) == (
        "kapi_probe_failed 4 (2 targets; each cut 3 / 1), watch_stale 1 (1 targets; each cut 0 / 1)"
    )
    assert refusals_text([{"kapi_probe_failed": {"a": 1.0}}]) == "kapi_probe_failed 1 (1 targets)"
    assert refusals_text([{}, {}]) == "none"

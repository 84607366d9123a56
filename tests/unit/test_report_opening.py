"""When a target's view counts as opening (aggregator/report.py ``Reporter.gaps``): starting to
judge, of which the extension's condition says nothing, as against a gap in a view it had."""

from __future__ import annotations

from aggregator.decide.trust import TrustWindow
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.report import OPENING_S, Reporter
from core import logs


def reporter(clock: list[float]) -> Reporter:
    return Reporter(
        "t", AggregatorMetrics(), wall=lambda: clock[0], log=logs.get("test"), event=lambda _r, _m: None
    )


def opening(r: Reporter) -> bool:
    return r.status.view_opening


def window(*, since: float | None, why: str) -> TrustWindow:
    w = TrustWindow(6.0, tick_s=1.0, stall_s=3.0, log=logs.get("test"))
    w.since, w.why = since, why
    return w


def test_a_first_view_not_yet_current_is_opening_for_a_while() -> None:
    """250 targets started at once waited 13 s for their first fresh view: each is starting, not
    blind; a view that never opens is a gap once OPENING_S has passed."""
    clock = [1000.0]
    r = reporter(clock)
    r.gaps(window(since=None, why="the view of the shoot is not current"))
    assert opening(r)
    clock[0] += OPENING_S + 1
    r.gaps(window(since=None, why="the view of the shoot is not current"))
    assert not opening(r)


def test_a_gap_after_a_trusted_view_is_no_opening() -> None:
    clock = [1000.0]
    r = reporter(clock)
    r.gaps(window(since=990.0, why="view fresh for 4.0s, judging after 6s"))
    assert opening(r)  # fresh, waiting out its first lease duration
    r.gaps(window(since=990.0, why=""))
    assert not opening(r)
    r.gaps(window(since=None, why="leases: watch failed 40s ago"))
    assert not opening(r)

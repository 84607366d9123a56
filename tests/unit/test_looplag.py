"""The event loop's lag: every target shares the loop, so its gaps are measured and named."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from aggregator.ops.looplag import LoopLag
from tests.unit.virtualtime import VirtualTimeLoop, in_virtual_time, now


def test_quantiles_over_the_window_only() -> None:
    lag = LoopLag(window_s=1000)
    for i in range(100):
        lag.record(float(i), i / 1000)  # 0 .. 99 ms
    assert (lag.quantile(0.5), lag.quantile(0.99)) == (0.049, 0.098)
    lag.record(2000.0, 0.5)  # long after: only this one is in the window
    assert lag.quantile(0.5) == lag.quantile(0.99) == 0.5
    assert lag.snapshot() == {"p50_s": 0.5, "p99_s": 0.5, "max_s": 0.5}
    assert LoopLag().quantile(0.99) == 0.0


def parse_for(seconds: float) -> None:
    """Synchronous work that holds the loop for ``seconds`` of its clock, as a long parse does."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    loop.advance(seconds)


# On the loop's virtual clock: in real time, a loaded machine starving the test's process was
# a second block, logged (pytest beside the Go builds at the lowest priority).
@in_virtual_time
async def test_a_blocked_loop_is_measured_and_logged() -> None:
    seen: list[float] = []
    lag = LoopLag(every_s=0.02, clock=now, observe=seen.append)
    with capture_logs() as logged:
        task = asyncio.create_task(lag.run())
        try:
            await asyncio.sleep(0.1)
            parse_for(0.25)
            await asyncio.sleep(0.1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert max(seen) >= 0.2 and lag.worst_s >= 0.2, seen
    blocked = [e for e in logged if e["event"] == "loop_blocked"]
    assert len(blocked) == 1 and blocked[0]["lag_s"] >= 0.2, logged

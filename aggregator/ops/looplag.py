"""How late the event loop runs: every target shares one loop.

A long parse or a GC pause is a gap in every target's view at once, and the stall rule then
(rightly) stops every target from judging. A timer that should fire every ``every_s`` and
fires late by ``lag`` says the loop was busy with something else for that long.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

from core import logs

log = logs.get("loop")


class LoopLag:
    def __init__(
        self,
        *,
        every_s: float = 0.1,
        window_s: float = 60.0,
        blocked_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[float], None] = lambda lag_s: None,
    ) -> None:
        self.every_s = every_s
        self.observe = observe
        self.blocked_s = blocked_s
        self.clock = clock
        # (when, lag) over the last window.
        self.samples: deque[tuple[float, float]] = deque()
        self.window_s = window_s
        self.worst_s = 0.0

    async def run(self) -> None:
        while True:
            before = self.clock()
            await asyncio.sleep(self.every_s)
            now = self.clock()
            self.record(now, max(0.0, now - before - self.every_s))

    def record(self, now: float, lag_s: float) -> None:
        self.samples.append((now, lag_s))
        while self.samples and self.samples[0][0] < now - self.window_s:
            self.samples.popleft()
        self.worst_s = max(self.worst_s, lag_s)
        self.observe(lag_s)
        if lag_s > self.blocked_s:
            log.warning("loop_blocked", lag_s=round(lag_s, 3))

    def worst_since(self, since: float) -> float:
        """The longest lag recorded since ``since`` (by ``clock``), and the one running now: a
        timer due but not yet fired is late already."""
        late = [lag for when, lag in self.samples if when >= since]
        return max(late, default=0.0)

    def quantile(self, q: float) -> float:
        """The lag at quantile ``q`` over the window (nearest rank); 0 before any sample."""
        lags = sorted(lag for _, lag in self.samples)
        if not lags:
            return 0.0
        return lags[min(len(lags), max(1, math.ceil(q * len(lags)))) - 1]

    def snapshot(self) -> dict[str, float]:
        return {
            "p50_s": round(self.quantile(0.5), 4),
            "p99_s": round(self.quantile(0.99), 4),
            "max_s": round(self.worst_s, 4),
        }

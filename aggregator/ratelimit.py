"""A client's requests held to a rate, as client-go's ``QPS`` and ``Burst`` hold a rest client's.

Each caller is given its own moment (the generic cell rate algorithm): ``burst`` requests may
go at once, then one every ``1 / qps`` seconds; a caller waits on one timer of its own, however
many wait, and the moments are handed out in the order callers asked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class RateLimit:
    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, not {qps} and {burst}")
        self.interval_s = 1.0 / qps
        # How far ahead of its cadence a request may go: the burst.
        self.tolerance_s = (burst - 1) * self.interval_s
        self.clock = clock
        self._next = -float("inf")  # when the next request would be due at the steady rate

    def reserve(self) -> float:
        """Seconds the caller waits before its request; the moment is its own from now on."""
        now = self.clock()
        due = max(self._next, now)
        self._next = due + self.interval_s
        return max(0.0, due - self.tolerance_s - now)

    async def wait(self) -> None:
        if (delay := self.reserve()) > 0:
            await asyncio.sleep(delay)

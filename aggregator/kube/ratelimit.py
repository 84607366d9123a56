"""A client's requests held to a rate, as client-go's ``QPS`` and ``Burst`` hold a rest client's.

Each caller is given its own moment (the generic cell rate algorithm): ``burst`` requests may
go at once, then one every ``1 / qps`` seconds; a caller waits on one timer of its own, however
many wait, and the moments are handed out in the order callers asked. A request that would
wait longer than ``max_wait_s`` is refused (``Throttled``) instead of joining a queue without
end, as client-go's event broadcaster drops what its queue cannot hold; a caller cancelled
while it waits gives its moment back when no one asked after it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from core.errors import Throttled


class RateLimit:
    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        max_wait_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, not {qps} and {burst}")
        self.qps, self.interval_s, self.max_wait_s = qps, 1.0 / qps, max_wait_s
        # How far ahead of its cadence a request may go: the burst.
        self.tolerance_s = (burst - 1) * self.interval_s
        self.clock = clock
        self._next = -math.inf  # when the next request would be due at the steady rate

    def reserve(self) -> float:
        """Seconds the caller waits before its request; the moment is its own from now on."""
        now = self.clock()
        due = max(self._next, now)
        delay = max(0.0, due - self.tolerance_s - now)
        if delay > self.max_wait_s:
            raise Throttled(f"{delay:.0f}s behind the rate limit of {self.qps:g}/s: not sent")
        self._next = due + self.interval_s
        return delay

    def release(self, taken_next: float) -> None:
        """A reserved moment not used: given back if it is still the last one handed out."""
        if self._next == taken_next:
            self._next -= self.interval_s

    async def wait(self) -> None:
        if (delay := self.reserve()) <= 0:
            return
        taken = self._next
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.release(taken)
            raise

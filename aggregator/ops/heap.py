"""The collector kept off the heap that lives as long as the process.

Every target shares one loop, and a full collection stops it. At 250 targets (bench/seed.py)
a full pass scanned ~160,000 objects that live as long as the process (modules, the targets,
their clients and informers), found nothing to free, and held the loop 130 ms; one came every
10-15 s, and two fell into the seed-wide outage's interlocks. Once the set of targets has been
still for a while, everything that exists is frozen (``gc.freeze``): later passes scan only what
was made since. Each change of the targets, and every ``every_s`` regardless, thaws, collects
and freezes again: a removed target's cycles are found then, at the cost of one full pass.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

from core import logs

log = logs.get("heap")


class Heap:
    def __init__(
        self,
        *,
        settle_s: float = 30.0,
        every_s: float = 600.0,
        check_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settle_s, self.every_s, self.check_s, self.clock = settle_s, every_s, check_s, clock
        self.changed_at = clock()
        self.frozen_at: float | None = None

    def changed(self) -> None:
        """The set of targets changed: what lives long is not what is frozen."""
        self.changed_at = self.clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self.changed_at < self.settle_s:
            return False  # targets still starting: their first LISTs are still arriving
        if self.frozen_at is None or self.frozen_at < self.changed_at:
            return True
        return now - self.frozen_at >= self.every_s

    def refreeze(self) -> None:
        gc.unfreeze()
        started = time.perf_counter()
        found = gc.collect()
        gc.freeze()
        self.frozen_at = self.clock()
        log.info(
            "heap_frozen",
            objects=gc.get_freeze_count(),
            collected=found,
            pause_ms=round((time.perf_counter() - started) * 1000, 1),
        )

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.check_s)
                if self.due():
                    self.refreeze()
        finally:
            gc.unfreeze()  # a stopped service thaws what it froze: nothing else here freezes

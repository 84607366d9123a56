"""The retry delays of the settings: a watch's restarts (settings.WatchSettings), a failed target's
and a failed Extension operation's (settings.ShootSettings)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Retry delays that double from ``first_s`` up to ``max_s``, each spread by ± ``jitter``."""

    first_s: float
    max_s: float
    jitter: float = 0.0

    def delays(self) -> Iterator[float]:
        """The nominal delays, without jitter (what a log line reports)."""
        delay_s = self.first_s
        while True:
            yield delay_s
            delay_s = min(delay_s * 2, self.max_s)

    def delay(self, attempt: int) -> float:
        """The nominal delay before retry ``attempt`` (1: the first)."""
        return min(self.first_s * 2.0 ** max(attempt - 1, 0), self.max_s)

    def spread(self, delay_s: float) -> float:
        """``delay_s`` with jitter, so that many retriers do not return in step."""
        return delay_s * random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else delay_s

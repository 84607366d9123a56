"""Leadership as a scope: whether this replica acts for a target, until when, and the writes it
made under that term that may still land.

A Lease (the leader's, or a shard's: aggregator/lead/leader.py, aggregator/lead/shards.py) is handed on
when its holder releases it or stops renewing it. A write whose answer the holder never got (a
time-out, a cancelled request, a 5xx) may still be applied by the API server after that, and
the next holder, which read the seed before it landed, would never look again: a scale-down of
a healthy shoot, for good. So a holder releases a Lease only once every write of its term has
an answer that says it did or did not land (``Writes.settled``); otherwise it lets the Lease
expire, a lease duration after its last renewal, and the next holder watches the seed for what
still arrives (aggregator/act/scaler.py ``_still_converged``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from core.errors import ApiError, BadResponse, KubeconfigError, Throttled, TransportError


class Writes:
    """The writes of one term: how many are in flight, and which objects a write may still reach."""

    def __init__(self) -> None:
        self.in_flight = 0
        # Paths written without an answer that says whether the write landed. A later write of
        # ours to the same path that is answered clears it: every write is conditional on the
        # resourceVersion it read, so the earlier one either landed before that read or never will.
        self.unsettled: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def write(self, path: str) -> Iterator[None]:
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        except BaseException as e:
            if not _answered(e):
                self.unsettled.add(path)
            else:
                self.unsettled.discard(path)
            raise
        else:
            self.unsettled.discard(path)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def settled(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the writes in flight to end; whether every write of the
        term is known to have landed or not (then the Lease may be released at once)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        return not self.in_flight and not self.unsettled

    @property
    def idle(self) -> bool:
        """Nothing in flight, and every write's fate known."""
        return not self.in_flight and not self.unsettled


def _answered(e: BaseException) -> bool:
    """Whether a failed write's fate is known: refused with an HTTP answer below 500, answered
    with something unreadable, or never sent (no name, no TLS session, our own rate limit, no
    credentials). A 5xx (an etcd time-out answers 500 or 504 and may still commit), a time-out,
    a cancellation or a connection lost once it was open may have landed, or may yet."""
    if isinstance(e, ApiError):
        return e.status < 500
    if isinstance(e, TransportError):
        return e.kind in ("dns", "tls") and not e.sent
    return isinstance(e, Throttled | KubeconfigError | BadResponse)


@dataclass(frozen=True)
class Scope:
    """What one target's writes run under: ``leads`` while this replica acts for it, each write
    bounded by ``term_end`` (by the replica's monotonic clock) and counted in ``writes``."""

    leads: Callable[[], bool] = lambda: True
    term_end: Callable[[], float] = lambda: math.inf
    writes: Writes = field(default_factory=Writes)


class Leadership(Protocol):
    """Who acts for what: the election (aggregator/lead/leader.py), the shards (aggregator/lead/shards.py),
    or a replica alone."""

    def leading(self) -> bool:
        """Whether this replica acts for any target now."""

    def scope(self, namespace: str) -> Scope:
        """The scope the target of ``namespace`` acts in."""


class Alone:
    """A single replica without election: it always leads, every target in one scope."""

    def __init__(self) -> None:
        self.everything = Scope()

    def leading(self) -> bool:
        return True

    def scope(self, namespace: str) -> Scope:
        del namespace
        return self.everything

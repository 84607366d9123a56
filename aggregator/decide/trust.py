"""Since when the view of one shoot is trusted.

A verdict needs a view that has been fresh for a lease duration without a gap:
both watches listed and delivering, the shoot KAPI ready, and our own process
running. A gap (a watch silent, a failed probe or LIST, the aggregator itself
stalled) restarts the wait, so no lease is judged on what a frozen view left
behind. After a gap the view starts again only once the shoot KAPI says it is
ready: a restarted one serves LISTs and watches before its /readyz is 200, and
the agents reach it only through a load balancer that admits traffic on
readiness, so their leases would look stale for as long as it takes to get ready.
"""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger


class TrustWindow:
    def __init__(self, lease_duration_s: float, *, tick_s: float, stall_s: float, log: FilteringBoundLogger):
        self.lease_duration_s = lease_duration_s
        self.tick_s = tick_s
        self.stall_s = stall_s
        self.log = log
        # Since when the view has been fresh without a gap (None: not now), on the monotonic clock.
        self.since: float | None = None
        # Why it is not trusted now ("" once the last gap is a lease duration behind us).
        self.why = "not listed yet"
        self._tick_done: float | None = None

    def see(self, now: float, *, listed: bool, watches_fresh: bool, unready: str = "") -> None:
        """``unready``: why the shoot KAPI is not ready, asked only while the view is in a gap
        (aggregator/target.py): a view starts again only from a ready KAPI."""
        if not listed:
            self.gap("not listed yet")
        elif not watches_fresh:
            self.gap("no data from the watches")
        elif self.since is None:
            if unready:
                self.gap(unready)
            else:
                self.since = now
                self.log.info("view_fresh", judging_in_s=self.lease_duration_s)
        elif self._tick_done is not None and now - self._tick_done > self.tick_s + self.stall_s:
            # Our own process did not run (SIGSTOP, a long GC, CPU starvation): whatever the
            # watches delivered meanwhile is still queued, the leases only look old. Measured
            # from the end of the last tick: a tick slowed by its own requests is no stall, the
            # watches ran meanwhile. The watches are fine, so the new view starts now.
            self.gap(f"the aggregator itself stalled for {now - self._tick_done:.1f}s")
            self.since = now
        if self.since is not None and now - self.since >= self.lease_duration_s:
            self.why = ""

    def gap(self, why: str) -> None:
        if self.since is not None:
            self.log.warning("view_gap", why=why)
        self.since = None
        self.why = why

    def ticked(self, now: float) -> None:
        """A tick ended: the stall rule measures from here."""
        self._tick_done = now

"""The renewal loop: one merge-PATCH per interval, through the external path.

States, each logged once when entered: ``renewing`` (the path works),
``failing`` (with its failure class), ``waiting`` (404: the aggregator has not
created the lease yet; not an outage). 429 means the path works and KAPI is
busy: back off as told and count it apart from failures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agent.client import LeaseClient
from agent.settings import MAX_INTERVAL_S, MIN_INTERVAL_S, Settings
from core import logs
from core.durations import parse_duration
from core.errors import KubeError, NotFound, ServerError, TooManyRequests, TransportError
from core.lease import RENEW_INTERVAL, Outage, release_patch, renew_patch
from core.metrics import Registry

log = logs.get("agent")

# Retry-After is honoured, but a proxy asking for an hour must not silence a node for an hour.
MAX_BACKOFF_S = 60.0
# Below this much time left in the interval a retry cannot finish: wait for the next tick.
MIN_RETRY_BUDGET_S = 0.05
RELEASE_TIMEOUT_S = 1.0


def wall_now() -> datetime:
    return datetime.now(UTC)


class AgentMetrics:
    def __init__(self, registry: Registry, last_success: Callable[[], float]) -> None:
        self.renewals = registry.counter("dwd_agent_renewals_total", "Lease renewals that succeeded.")
        self.failures = registry.counter(
            "dwd_agent_failures_total", "Renewals that failed, by failure class.", ["class"]
        )
        self.throttled = registry.counter(
            "dwd_agent_throttled_total", "Renewals answered 429: the path works, KAPI asked to back off."
        )
        self.lease_missing = registry.counter(
            "dwd_agent_lease_missing_total", "Renewals answered 404: the lease is not created yet."
        )
        self.interval = registry.gauge("dwd_agent_renew_interval_seconds", "The interval in force.")
        registry.gauge(
            "dwd_agent_last_success_age_seconds",
            "Seconds since the last successful renewal (+Inf before the first).",
            fn=last_success,
        )


class Renewer:
    def __init__(
        self,
        settings: Settings,
        client: LeaseClient,
        registry: Registry | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = wall_now,
    ) -> None:
        self.settings = settings
        self.client = client
        self.clock = clock
        self.wall = wall
        self.interval_s = settings.renew_interval_s
        self.state = "starting"
        self.failure_class = ""
        self.last_success: float | None = None
        # A released flag left by a previous run is cleared by the first renewal.
        self._clear_released = True
        # Wall and monotonic start of the current outage, and the class that began it:
        # what broke first is the cause; later classes are often its echoes (a resolver
        # slowed by the same fault times out).
        self._outage_start: tuple[datetime, float, str] | None = None
        self._bad_interval = ""
        self.metrics = AgentMetrics(registry or Registry(), self._last_success_age)
        self.metrics.interval.set(self.interval_s)
        self.log = log.bind(node=settings.node_name)

    def _last_success_age(self) -> float:
        return float("inf") if self.last_success is None else self.clock() - self.last_success

    @property
    def attempt_timeout_s(self) -> float:
        # Two attempts (the first and its retry on a fresh connection) fit in one interval.
        return min(self.settings.request_timeout_s, self.interval_s / 2)

    async def run(self, stop: asyncio.Event) -> None:
        """Renew until ``stop`` is set; then mark the lease released."""
        self.log.info("agent_started", url=self.settings.apiserver_url, interval=self.interval_s)
        next_at = self.clock()
        try:
            while not stop.is_set():
                delay = next_at - self.clock()
                if delay > 0:
                    try:
                        async with asyncio.timeout(delay):
                            await stop.wait()
                        break
                    except TimeoutError:
                        pass
                started = self.clock()
                wait_s = await self.renew_once(deadline=started + self.interval_s)
                # Fixed-rate schedule: the time a renewal takes does not push every later one back.
                next_at = started + wait_s
        finally:
            await asyncio.shield(self._release())

    async def renew_once(self, deadline: float) -> float:
        """One renewal with at most one retry on a fresh connection; returns seconds until the next."""
        fresh = False
        while True:
            now = self.wall()
            patch = renew_patch(
                self.settings.node_name,
                now,
                clear_released=self._clear_released,
                last_outage=self._outage_so_far(),
            )
            try:
                lease = await self.client.patch(patch, timeout_s=self.attempt_timeout_s, fresh=fresh)
            except NotFound:
                self.metrics.lease_missing.inc()
                self._enter("waiting", "lease_missing", level="info")
                return self.interval_s
            except TooManyRequests as e:
                self.metrics.throttled.inc()
                self.log.debug("renew_throttled", retry_after=e.retry_after_s)
                return min(max(e.retry_after_s or 0.0, self.interval_s), MAX_BACKOFF_S)
            except (TransportError, ServerError) as e:
                if e.failure_class == "tls":
                    self.client.reload_tls()
                if not fresh and deadline - self.clock() >= MIN_RETRY_BUDGET_S:
                    self.log.debug("renew_retry", failure=e.failure_class, error=str(e))
                    fresh = True
                    continue
                self._failed(e)
                return self.interval_s
            except KubeError as e:
                self._failed(e)
                return self.interval_s
            self._succeeded(lease)
            return self.interval_s

    def _outage_so_far(self) -> Outage | None:
        if self._outage_start is None:
            return None
        start_wall, start_mono, first_class = self._outage_start
        return Outage(start_wall, self.clock() - start_mono, first_class)

    def _enter(self, state: str, event: str, *, level: str = "info", **kw: Any) -> None:
        if state != self.state:
            getattr(self.log, level)(event, **kw)
        self.state = state

    def _failed(self, e: KubeError) -> None:
        self.metrics.failures.inc(**{"class": e.failure_class})
        if self._outage_start is None:
            self._outage_start = (self.wall(), self.clock(), e.failure_class)
        if self.state != "failing" or self.failure_class != e.failure_class:
            self.log.warning("renew_failing", failure=e.failure_class, error=str(e))
        self.failure_class = e.failure_class
        self.state = "failing"

    def _succeeded(self, lease: dict[str, Any]) -> None:
        self.metrics.renewals.inc()
        self.last_success = self.clock()
        self._clear_released = False
        outage = self._outage_so_far()
        if outage is not None:
            self.log.info(
                "renew_recovered", failure=outage.failure_class, outage_s=round(outage.duration_s, 3)
            )
            self._outage_start = None
            self.failure_class = ""
        self._enter("renewing", "lease_renewing")
        self.log.debug("lease_renewed")
        self._adopt_interval(lease)

    def _adopt_interval(self, lease: dict[str, Any]) -> None:
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(RENEW_INTERVAL)
        wanted = self.settings.renew_interval_s
        if text:
            try:
                wanted = min(max(parse_duration(text), MIN_INTERVAL_S), MAX_INTERVAL_S)
            except ValueError:
                if text != self._bad_interval:
                    self.log.warning("renew_interval_invalid", annotation=text, keeping=self.interval_s)
                    self._bad_interval = text
                return
        if wanted != self.interval_s:
            self.log.info("renew_interval_changed", interval=wanted, previous=self.interval_s)
            self.interval_s = wanted
            self.metrics.interval.set(wanted)

    async def _release(self) -> None:
        """Mark the lease released, bounded: shutting down must not hang on a broken path."""
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                await self.client.patch(release_patch(), timeout_s=RELEASE_TIMEOUT_S)
            self.log.info("lease_released")
        except (KubeError, TimeoutError) as e:
            self.log.warning("lease_release_failed", error=str(e) or type(e).__name__)
        finally:
            await self.client.aclose()

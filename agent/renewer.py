"""The renewal loop: one merge-PATCH per interval, through the external path.

States (``State``), each logged once when entered: ``renewing`` (the path
works), ``failing`` (with its failure class), ``waiting`` (404: the aggregator
has not created the lease yet; not an outage). 429 means the path works and KAPI
is busy: back off as told and count it apart from failures.

A renewal may use twice the interval (its *window*, at most 10 s): a slow path
is still a path. What the lease is proven to have gone through is the ledger's
(agent/ledger.py); the old layout's lease, renewed beside ours during a move,
is agent/legacy.py's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from agent.client import LeaseClient
from agent.ledger import Ledger, Unrenewed
from agent.legacy import LegacyLease
from agent.path import PHASES, Attempt
from agent.settings import Settings
from core import logs
from core.errors import Invalid, KubeError, NotFound, TooManyRequests, TransportError
from core.lease import (
    MAX_RENEW_INTERVAL_S,
    MAX_RENEWAL_WINDOW_S,
    MIN_RENEW_INTERVAL_S,
    LeaseView,
    Outage,
    evidence_patch,
    format_micro_time,
    missing_wait_s,
    next_renewal_in_s,
    release_patch,
    renew_patch,
)
from core.metrics import Registry

log = logs.get("agent")

# Retry-After is honoured, but a proxy asking for an hour must not silence a node for an hour.
MAX_BACKOFF_S = 60.0
# Each release (ours, and during a move the first layout's) gets this long, so both fit the
# DaemonSet's 5 s grace period: a release that gives up leaves its lease to go stale as a cut
# node's does, and 1 s gave up beside a loaded API server during a roll (tests/integration/test_roll.py).
RELEASE_TIMEOUT_S = 2.0


PATH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


class State(StrEnum):
    """Where the renewals stand; entered only through ``Renewer._enter``."""

    STARTING = "starting"
    RENEWING = "renewing"
    FAILING = "failing"
    WAITING = "waiting"


class Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


class _Urandom:
    """The one draw the agent makes (a missing lease's spread), from os.urandom: the random
    module, with bisect and _sha512, would cost every node 0.16 MiB for it."""

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * int.from_bytes(os.urandom(7), "big") / 2**56


def _as_lease(answer: dict[str, Any], node: str) -> LeaseView:
    """A 2xx answer to the PATCH of the node's lease is that lease: the renewal landed and the
    path works, whatever the answer lacks (the name too: it is the lease the agent patched).
    Parsed as the aggregator parses a lease."""
    meta = answer.get("metadata")
    return LeaseView.from_object(
        {**answer, "metadata": {**(meta if isinstance(meta, dict) else {}), "name": node}}, legacy=True
    )


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
        self.unanswered = registry.counter(
            "dwd_agent_unanswered_total",
            "Renewals sent but never answered: they may have landed (also counted as failures).",
        )
        self.landed_unseen = registry.counter(
            "dwd_agent_unanswered_landed_total",
            "Unanswered renewals that the lease later showed had landed: no outage after all.",
        )
        self.phases = registry.histogram(
            "dwd_agent_path_seconds",
            "Time of each step of the path: dns, connect, tls and request on new connections, "
            "request on warm ones.",
            ["phase", "connection"],
            PATH_BUCKETS,
        )
        self.connections = registry.counter(
            "dwd_agent_connections_opened_total", "New connections tried (each one looks the name up)."
        )
        self.interval = registry.gauge("dwd_agent_renew_interval_seconds", "The interval in force.")
        registry.gauge(
            "dwd_agent_last_success_age_seconds",
            "Seconds since the last successful renewal (+Inf before the first).",
            fn=last_success,
        )


@dataclass(frozen=True)
class Standing:
    """Where the renewer stands between renewals: one value, replaced by what each renewal
    answered (``renewed``, ``failed``, ``missing``)."""

    state: State = State.STARTING
    # Why it is failing (in FAILING only, "" in every other state).
    failure_class: str = ""
    # A released flag left by a previous run is cleared by the first renewal.
    clear_released: bool = True
    # An evidence patch needs renewTime and annotations to exist; the last answer says.
    evidence_possible: bool = False
    # The last answer still carries the evidence of an unseen renewal: the next one clears it.
    previous_left: bool = False
    # An outage proven by an evidence patch, written with the next plain renewal.
    unwritten: Outage | None = None
    # 404s since the last renewal: the wait for a lease not provisioned yet grows with them.
    # Only a renewal ends the run: agents answered 429 between 404s (KAPI's priority and
    # fairness during a fresh install) would otherwise start again at the interval.
    misses: int = 0
    # The last renew-interval annotation that could not be read (said once, not every renewal).
    bad_interval: str = ""

    def renewed(self, lease: LeaseView, outage: Outage | None) -> Standing:
        """A renewal went through; ``outage``: the one it ended, as the ledger proved it."""
        previous_left = lease.previous_renew is not None
        return replace(
            self,
            state=State.RENEWING,
            failure_class="",
            clear_released=False,
            evidence_possible=bool(lease.renew_time) and lease.annotated,
            previous_left=previous_left,
            unwritten=(outage if previous_left else None) if self.state is State.FAILING else self.unwritten,
            misses=0,
        )

    def failed(self, failure_class: str) -> Standing:
        return replace(self, state=State.FAILING, failure_class=failure_class)

    def missing(self) -> Standing:
        return replace(self, state=State.WAITING, failure_class="", misses=self.misses + 1)

    def entered(self, before: Standing) -> bool:
        """Whether this is a new state (failing: of a new class) after ``before``: logged once per
        state, not once per renewal."""
        return (self.state, self.failure_class) != (before.state, before.failure_class)


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
        self.standing = Standing()
        self.last_success: float | None = None
        self.random: Uniform = _Urandom()
        self.metrics = AgentMetrics(registry or Registry(), self._last_success_age)
        self.metrics.interval.set(self.interval_s)
        self.log = log.bind(node=settings.node_name)
        self.ledger = Ledger(self.log, self.metrics.landed_unseen)
        self.legacy = LegacyLease(settings.legacy_namespace, settings.node_name, self.log)

    def _last_success_age(self) -> float:
        return float("inf") if self.last_success is None else self.clock() - self.last_success

    @property
    def state(self) -> State:
        return self.standing.state

    def observe(self, attempt: Attempt) -> None:
        """What one HTTP attempt's timings tell the metrics, and the ledger where it reached no
        server (the composition root hands this to the client: agent/__main__.py)."""
        connection = "new" if attempt.new else "warm"
        if not attempt.reached:
            self.ledger.last_ok = attempt.summary()
        if attempt.new:
            self.metrics.connections.inc()
        for phase in PHASES:
            if phase in attempt.phases:
                self.metrics.phases.observe(attempt.phases[phase], phase=phase, connection=connection)

    @property
    def window_s(self) -> float:
        """How long one renewal may take: two intervals, at most kubelet's 10 s. One that lands
        at its window's very end leaves a gap of an interval and a window since the last, which
        the default lease duration still covers (docs/agent.md, "Why a window of two
        intervals")."""
        return min(2 * self.interval_s, MAX_RENEWAL_WINDOW_S)

    async def run(self, stop: asyncio.Event) -> None:
        """Renew until ``stop`` is set; then mark the lease released."""
        self.log.info(
            "agent_started",
            url=self.settings.apiserver_url,
            url_from=self.settings.server_from,
            tls_server_name=self.settings.server_name,
            interval=self.interval_s,
        )
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
                wait_s = await self.renew_once()
                # Fixed-rate schedule: the time a renewal takes does not push every later one back.
                next_at = started + wait_s
        finally:
            await asyncio.shield(self._release())

    async def renew_once(self) -> float:
        """One renewal, within its window; returns seconds until the next."""
        started = self.clock()
        stamp = self.wall()
        try:
            lease = await self._renew(stamp, started)
        except NotFound:
            self.metrics.lease_missing.inc()
            if self._enter(self.standing.missing()):
                self.log.info("lease_missing")
            # An aggregator of the old layout provisions no lease of ours: the old one is what
            # it judges, renewed at its pace while it is there, even after a write of it failed
            # (the missing lease's backoff would leave it unrenewed for up to a minute).
            if (legacy := await self._renew_legacy(stamp, started)) is not None:
                self._adopt_interval(legacy)
            if self.legacy.path is not None:
                return self.interval_s
            return missing_wait_s(self.standing.misses, self.interval_s, self.random.uniform(0.5, 1.0))
        except TooManyRequests as e:
            self.metrics.throttled.inc()
            self.log.debug("renew_throttled", retry_after=e.retry_after_s)
            return min(max(e.retry_after_s or 0.0, self.interval_s), MAX_BACKOFF_S)
        except KubeError as e:
            if e.failure_class == "tls" and (why := self.client.reload_tls()):
                self.log.warning("ca_unreadable", error=why, kept="the CA read before")
            self._failed(e, stamp, started)
            return self.interval_s
        self._succeeded(lease)
        await self._renew_legacy(stamp, started)
        return next_renewal_in_s(self.settings.node_name, self.interval_s, stamp.timestamp())

    async def _renew_legacy(self, stamp: datetime, started: float) -> LeaseView | None:
        """Renews the old layout's lease too while it is there (agent/legacy.py). Only after a
        renewal of ours went through (or found no lease of ours): on a broken path the old one
        fails alike. Its own window, at least half of one: ours may have used it up."""
        window = max(self.window_s - (self.clock() - started), self.window_s / 2)
        answer = await self.legacy.renew(self.client, stamp, window)
        return None if answer is None else _as_lease(answer, self.settings.node_name)

    async def _renew(self, stamp: datetime, started: float) -> LeaseView:
        """The renewal (with the evidence of an unseen one when there is some to give), and the
        lease as the server wrote it, parsed once."""
        lease, with_evidence = await self._patch(stamp, started)
        view = _as_lease(lease, self.settings.node_name)
        if with_evidence:
            self.ledger.settle(view.previous_renew or "")
        return view

    async def _patch(self, stamp: datetime, started: float) -> tuple[dict[str, Any], bool]:
        if self.ledger.unsure() and self.standing.evidence_possible:
            try:
                lease = await self.client.patch(
                    evidence_patch(self.settings.node_name, stamp), window_s=self.window_s
                )
            except Invalid as e:
                # No renewTime or no annotations to copy into: renew plainly, prove nothing.
                self.log.info("renew_evidence_refused", error=str(e))
                self.standing = replace(self.standing, evidence_possible=False)
            else:
                return lease, True
        patch = renew_patch(
            self.settings.node_name,
            stamp,
            clear_released=self.standing.clear_released,
            clear_previous=self.standing.previous_left,
            last_outage=self.ledger.outage(self.clock()) or self.standing.unwritten,
        )
        lease = await self.client.patch(patch, window_s=self.window_s - (self.clock() - started))
        self.standing = replace(self.standing, unwritten=None)
        return lease, False

    def _enter(self, standing: Standing) -> bool:
        """The one way to a new standing; whether its state is a new one, which the caller logs
        (once per state, not once per renewal)."""
        before, self.standing = self.standing, standing
        return standing.entered(before)

    def _failed(self, e: KubeError, stamp: datetime, started: float) -> None:
        self.metrics.failures.inc(**{"class": e.failure_class})
        sent = isinstance(e, TransportError) and e.sent
        if sent:
            self.metrics.unanswered.inc()
        path = e.path if isinstance(e, TransportError) else ()
        self.ledger.failed(Unrenewed(format_micro_time(stamp), stamp, started, e.failure_class, sent, path))
        if self._enter(self.standing.failed(e.failure_class)):
            self.log.warning("renew_failing", failure=e.failure_class, error=str(e), path=list(path))
        else:
            self.log.debug("renew_failed", failure=e.failure_class, path=list(path))

    def _succeeded(self, lease: LeaseView) -> None:
        self.metrics.renewals.inc()
        self.last_success = self.clock()
        failing = self.standing.failure_class if self.state is State.FAILING else None
        outage = self.ledger.outage(self.clock()) if failing is not None else None
        entered = self._enter(self.standing.renewed(lease, outage))
        if failing is not None:
            self.log.info(
                "renew_recovered",
                failure=outage.failure_class if outage else failing,
                outage_s=round(outage.duration_s, 3) if outage else 0.0,
                proven=outage is not None,
            )
        self.ledger.renewed(lease.renew_time or "")
        if entered:
            self.log.info("lease_renewing")
        self.log.debug("lease_renewed")
        self._adopt_interval(lease)

    def _adopt_interval(self, lease: LeaseView) -> None:
        text, wanted = lease.interval, self.settings.renew_interval_s
        if text:
            if lease.interval_s is None:
                if text != self.standing.bad_interval:
                    self.log.warning("renew_interval_invalid", annotation=text, keeping=self.interval_s)
                    self.standing = replace(self.standing, bad_interval=text)
                return
            wanted = min(max(lease.interval_s, MIN_RENEW_INTERVAL_S), MAX_RENEW_INTERVAL_S)
        if wanted != self.interval_s:
            self.log.info("renew_interval_changed", interval=wanted, previous=self.interval_s)
            self.interval_s = wanted
            self.metrics.interval.set(wanted)

    async def _release(self) -> None:
        """Mark the lease released, and the old layout's during a move (renewed after ours, it
        is the one an aggregator judges), each bounded: shutting down must not hang on a
        broken path."""
        try:
            await self._release_one("own", self.client.patch(release_patch(), window_s=RELEASE_TIMEOUT_S))
            if self.legacy.path is not None:
                await self._release_one("legacy", self.legacy.release(self.client, RELEASE_TIMEOUT_S))
        finally:
            await self.client.aclose()

    async def _release_one(self, lease: str, release: Awaitable[object]) -> None:
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                await release
            self.log.info("lease_released", lease=lease)
        except (KubeError, TimeoutError) as e:
            self.log.warning("lease_release_failed", lease=lease, error=str(e) or type(e).__name__)

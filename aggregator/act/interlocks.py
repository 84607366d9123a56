"""The checks a scale-down must pass, right before it, on the replica that acts.

Each is a fresh look at what the verdict rests on: the shoot's KAPI answers a
probe on a new connection (so the seed's own path is not what broke), the
watches are fresh, and a confirming LIST, with the second witness and the
Machines read again, still gives a scale-down. A failed probe or LIST is a gap
in the view: nothing is judged again for a lease duration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from aggregator.decide.trust import TrustWindow
from aggregator.kube.client import KubeApi
from aggregator.model.verdict import Verdict
from aggregator.observe.evidence import Evidence
from aggregator.observe.watcher import Informer
from core.errors import KubeError, TransportError
from core.lease import LeaseView


class Interlock(StrEnum):
    """The checks a scale-down must pass; the value is the metrics' reason label."""

    KAPI_PROBE = "kapi_probe_failed"
    WATCH_STALE = "watch_stale"
    LIST_FAILED = "list_failed"
    LIST_DISAGREES = "list_disagrees"
    # The stale nodes' kubelets renewed after their agents went quiet: the agents fail.
    PATH_ALIVE = "kubelets_renewing"
    # A probe or LIST that timed out while our own event loop ran late: evidence of our own
    # load, not of the shoot's. Checked again at the next tick; nothing else is undone.
    SELF_OVERLOADED = "self_overloaded"


@dataclass(frozen=True)
class Refusal:
    """An interlock that refused a scale-down, and what it saw."""

    interlock: Interlock
    detail: str

    @property
    def deferred(self) -> bool:
        """Nothing was learnt about the shoot: try again at the next tick, confirmation kept."""
        return self.interlock is Interlock.SELF_OVERLOADED

    def __str__(self) -> str:
        return f"{self.interlock}: {self.detail}"


class Interlocks:
    def __init__(
        self,
        shoot: KubeApi,
        leases: Informer[LeaseView],
        evidence: Evidence,
        view: TrustWindow,
        *,
        watches_fresh: Callable[[], bool],
        probe_timeout_s: float,
        lag_since: Callable[[float], float] = lambda _since: 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shoot = shoot
        self.leases = leases
        self.evidence = evidence
        self.view = view
        self.watches_fresh = watches_fresh
        self.probe_timeout_s = probe_timeout_s
        # How late our own event loop ran since a moment (aggregator/ops/looplag.py).
        self.lag_since = lag_since
        self.clock = clock

    async def refusal(self, confirm: Callable[[], Verdict]) -> Refusal | None:
        """Why a scale-down must not happen now; None when every check passes. ``confirm``
        judges again on what the confirming LIST and reads left in the view: the LIST replaces
        the informer's store (its watch restarts from the LIST's resourceVersion, so a store
        of its own would drift from the watch); the tick's own verdict was made before it."""
        # Judged before the requests: a failed confirming LIST leaves the watches looking stale.
        fresh = self.watches_fresh()
        started = self.clock()
        # Sent together: one after the other, each added its own round trip to a real
        # scale-down (a kubelet LIST is 225-284 ms at 5000 nodes, docs/scale.md; the interlocks
        # took 1.4 s in a seed-wide outage of 250 targets, bench/seed.py). Their failures are
        # their own: a kubelet read that fails leaves no witness, a Machine read keeps the last.
        probed, listed, *_ = await asyncio.gather(
            self.shoot.probe(timeout_s=self.probe_timeout_s),
            self.leases.list_now(),
            self.evidence.read_kubelets(),
            self.evidence.read_machines(),
            return_exceptions=True,
        )
        for r in (probed, listed, *_):
            if isinstance(r, BaseException) and not isinstance(r, KubeError):
                raise r  # a bug, not an answer
        if (late := self._overloaded(started, probed, listed)) is not None:
            return late
        if isinstance(probed, KubeError):
            self.view.gap("the shoot KAPI did not answer the probe")
            return Refusal(Interlock.KAPI_PROBE, str(probed))
        if not fresh:
            self.view.gap("no data from the watches")
            return Refusal(Interlock.WATCH_STALE, "no data from the watches recently, our view may be frozen")
        if isinstance(listed, KubeError):
            self.view.gap("the confirming LIST failed")
            return Refusal(Interlock.LIST_FAILED, str(listed))
        return _disagreement(confirm())

    def _overloaded(self, started: float, *answers: object) -> Refusal | None:
        """A probe or LIST that ran out of time while our own loop was late by a good part of
        that time: the time went to our other targets (a seed-wide cut runs every target's
        interlocks at once), so it says nothing of the shoot. The view has no gap, confirmation
        goes on, and the checks run again at the next tick."""
        timed_out = [a for a in answers if isinstance(a, TransportError) and a.kind == "timeout"]
        lag_s = self.lag_since(started)
        if not timed_out or lag_s < self.probe_timeout_s * OVERLOAD_SHARE:
            return None
        return Refusal(
            Interlock.SELF_OVERLOADED, f"{timed_out[0]} while our own event loop ran {lag_s:.2f}s late"
        )


# A time-out is our own doing when the loop ran late by this share of the probe's time-out or
# more (0.75 s of the 3 s): the targets' interlocks share one loop, and a seed-wide cut's TLS
# handshakes and LISTs kept it 1.76 s late (250 targets, docs/scale.md).
OVERLOAD_SHARE = 0.25


def _disagreement(confirmed: Verdict) -> Refusal | None:
    if confirmed.scale_down:
        return None
    if confirmed.path_alive:
        return Refusal(
            Interlock.PATH_ALIVE,
            f"{len(confirmed.path_alive)} silent agents' kubelets renewed after them: the path works",
        )
    return Refusal(
        Interlock.LIST_DISAGREES, f"a fresh LIST shows {confirmed.stale}/{confirmed.candidates} stale"
    )

"""Records of ours whose target is gone: restored by the leader, not by a task per target.

A target can go while it holds its dependents down: its Cluster hibernated or
deleted, its entry gone from the targets file, and the aggregator restarted or
rolled before anything restored them. The record on the Deployments is the only
state that survives all of that, so that is what is swept: the leader lists our
label across the seed when it starts leading, whenever the fleet drops a target,
and every ``ShootSettings.sweep_s`` (a minute); a record in a namespace that no
target serves is restored once it has been seen orphaned for the recovery period,
only where it is ours (a dependent with somebody else's marks is never touched).
A standby does nothing and keeps nothing: the next leader starts from the seed.

A record on a dependent that is no longer configured (a rollout dropped it from the
dependents file while the shoot was held down) is an orphan too, in a namespace that is
served as in any other: no target acts on it any more, and it must not stay at 0 for good.

The sweep takes every record of ours in the seed that it does not serve for an orphan,
so a seed has one aggregator with targets from a file or from Gardener (as it has one
dependency-watchdog prober); one with a single target from the environment sweeps only
its own namespace's records on dependents it no longer has.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aggregator.act.scaler import Scaler
from aggregator.kube.client import METADATA_LIST, KubeApi
from aggregator.lead.scope import Alone, Leadership
from aggregator.model.dependents import KIND_PATHS, Dependent, Step
from aggregator.model.objects import metadata
from aggregator.model.records import RECORD
from aggregator.model.settings import Settings
from aggregator.model.verdict import Desired
from aggregator.ops.metrics import AggregatorMetrics
from core import logs
from core.errors import KubeError

log = logs.get("fleet")

# Where records can be, listed across namespaces, for each kind the dependents file accepts.
COLLECTIONS = {(api, kind): f"/apis/{api}/{kind.lower()}s" for api, kind in KIND_PATHS}

Served = Callable[[], "set[str] | None"]


class Orphans:
    """The leader's sweep for records whose namespace no target serves."""

    def __init__(
        self,
        seed: KubeApi,
        dependents: Sequence[Dependent],
        settings: Settings,
        metrics: AggregatorMetrics,
        *,
        served: Served,
        skipped_because: Callable[[str], str] = lambda _namespace: "",
        dependents_of: Callable[[str], Sequence[Dependent]] | None = None,
        leadership: Leadership | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seed = seed
        self.dependents = tuple(dependents)
        self.settings = settings
        self.metrics = metrics
        # The namespaces the fleet serves now; None while that is not known (no answer from
        # the source yet, or it fails): then nothing is an orphan.
        self.served = served
        # Why a namespace's own controller decides its dependents now ("" when nothing says so):
        # a Cluster gardenlet hibernates, deletes or migrates. Its records are handed back, not
        # restored: raising a hibernated shoot's controllers would fight the owner's 0.
        self.skipped_because = skipped_because
        # The dependents a served namespace's target acts on (a shoot's providerConfig may name
        # its own): a record on another is no target's.
        self.dependents_of = dependents_of or (lambda _namespace: self.dependents)
        # Whether this replica sweeps at all, and (sharded) which namespaces and in which scope:
        # a namespace's records are restored by the one replica that would act for its target.
        self.leadership = leadership or Alone()
        self.clock = clock
        self.wake = asyncio.Event()
        # Namespace -> the names carrying our record there, and since when it is orphaned.
        self.found: dict[str, dict[str, str]] = {}
        # Of those, the ones no target acts on (``_orphaned``).
        self.orphaned: dict[str, dict[str, str]] = {}
        self.since: dict[str, float] = {}
        self.scalers: dict[str, Scaler] = {}
        self._listed_at = -math.inf
        self._error = ""

    async def run(self) -> None:
        while True:
            if self.leadership.leading():
                await self.sweep()
            else:
                self._forget()
            self.wake.clear()
            pause_s = self.settings.shoots.sweep_s
            if self.since or not self.leadership.leading():
                # Orphans waiting, or a standby (no I/O) that must sweep soon after it leads.
                pause_s = min(pause_s, self.settings.shoots.orphan_recheck_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause_s):
                    await self.wake.wait()

    def _forget(self) -> None:
        self.found, self.orphaned, self.since, self.scalers, self._listed_at = {}, {}, {}, {}, -math.inf
        self.metrics.orphans.set(0)

    async def sweep(self) -> None:
        """One pass: list when due, then restore what has been orphaned long enough."""
        served = self.served()
        if served is None:
            return
        now = self.clock()
        if self.wake.is_set() or now - self._listed_at >= self.settings.shoots.sweep_s:
            try:
                self.found = await self._list(served)
            except KubeError as e:
                if str(e) != self._error:
                    log.warning("orphan_sweep_failed", error=str(e))
                self._error = str(e)
                return
            self._error, self._listed_at = "", now
        orphaned = self._orphaned(served)
        self.since = {ns: self.since.get(ns, now) for ns in orphaned}
        # A scaler is kept while it restores the same names (its read cache stays warm).
        self.scalers = {ns: s for ns, s in self.scalers.items() if orphaned.get(ns) == self.orphaned.get(ns)}
        self.orphaned = orphaned
        self.metrics.orphans.set(len(orphaned))
        for ns in sorted(orphaned):
            if (
                now - self.since[ns] >= self.settings.decider.recovery_period_s
                and self.leadership.scope(ns).leads()
            ):
                await self._restore(ns)

    def _orphaned(self, served: set[str]) -> dict[str, dict[str, str]]:
        """Namespace -> the records found there that no target acts on: all of them where no
        target serves the namespace, else those on names no longer configured. One target from
        the environment judges no other namespace: another aggregator may serve it."""
        out = {}
        for ns, names in self.found.items():
            configured = {d.name for d in self.dependents_of(ns)}
            if ns not in served and not self._env:
                out[ns] = names
            elif ns in served and (dropped := {n: k for n, k in names.items() if n not in configured}):
                out[ns] = dropped
        return out

    @property
    def _env(self) -> bool:
        return self.settings.shoots.mode == "env"

    async def _list(self, served: set[str]) -> dict[str, dict[str, str]]:
        """Namespace -> {name: kind} of every object carrying our record across the seed: by our
        label, and the configured dependents by name with our annotation. Either mark alone is
        ours (another writer may drop one): a dropped label must not hide a record, nor a
        dropped annotation. One target from the environment lists its own namespace by the
        label alone (its RBAC may grant no more; what it has configured is its target's).
        Where a record of ours is, or was at the last pass, every object of those kinds is
        listed too, metadata only: a record on a dependent no longer configured is found by
        our label alone, no target writes a lost mark back on it, and the model's soak found
        another writer removing that label (the dependent held at 0 for good)."""
        found: dict[str, dict[str, str]] = {}
        # Only the kinds that are configured: the seed's RBAC grants no more.
        kinds = sorted({(d.api_version, d.kind) for d in self.dependents})
        for api_version, kind in kinds:
            path = COLLECTIONS[(api_version, kind)]
            if self._env:
                listed = [await self.seed.get(_in(path, ns), labelSelector=RECORD) for ns in sorted(served)]
            else:
                listed = [await self.seed.get(path, labelSelector=RECORD)]
            for name in sorted(
                {d.name for d in self.dependents if (d.api_version, d.kind) == (api_version, kind)}
            ):
                if not self._env:
                    listed.append(await self.seed.get(path, fieldSelector=f"metadata.name={name}"))
            _collect(found, listed, kind)
        for ns in sorted(found.keys() | self.found.keys()):
            for api_version, kind in kinds:
                path = _in(COLLECTIONS[(api_version, kind)], ns)
                _collect(found, [await self.seed.request("GET", path, accept=METADATA_LIST)], kind)
        return found

    async def _restore(self, namespace: str) -> None:
        scaler = self.scalers.get(namespace)
        if scaler is None:
            scaler = self.scalers[namespace] = Scaler(
                self.seed,
                namespace,
                self._dependents(self.orphaned[namespace]),
                settings=self.settings.scaling,
                label=namespace,
                scope=self.leadership.scope(namespace),
                clock=self.clock,
            )
            log.info("orphan_restoring", namespace=namespace, resources=sorted(self.orphaned[namespace]))
        if skipped := self.skipped_because(namespace):
            reason = f"not served ({skipped}): the controllers are gardenlet's to run, our marks go"
            done = await scaler.hand_back(reason)
        else:
            reason = (
                "no longer a configured dependent: restoring what was scaled down"
                if namespace in (self.served() or set())
                else "no target serves this namespace any more: restoring what it scaled down"
            )
            done = await scaler.converge(Desired.RUNNING, reason)
        if done:
            log.info("orphan_restored", namespace=namespace, handed_back=skipped or None)
            for store in (self.found, self.orphaned, self.since, self.scalers):
                store.pop(namespace, None)

    def _dependents(self, names: dict[str, str]) -> list[Dependent]:
        """The configured dependents that carry a record, in their order; a record on anything
        else (the dependents file changed meanwhile) comes back after them."""
        known = [d for d in self.dependents if d.name in names]
        last = max((d.scale_up.level for d in self.dependents), default=0) + 1
        extra = [
            Dependent("apps/v1", kind, name, True, Step(last, 0.0, 30.0), Step(0, 0.0, 30.0))
            for name, kind in sorted(names.items())
            if name not in {d.name for d in known}
        ]
        return known + extra


def _collect(found: dict[str, dict[str, str]], answers: list[dict[str, Any]], kind: str) -> None:
    """Into ``found``, what the LIST ``answers`` hold that carries a mark of ours."""
    for obj in (o for answer in answers for o in answer.get("items") or []):
        meta = metadata(obj)
        if meta.get("namespace") and meta.get("name") and _ours(meta):
            found.setdefault(str(meta["namespace"]), {})[str(meta["name"])] = kind


def _ours(meta: Mapping[str, Any]) -> bool:
    """Either of our two marks: another writer may have dropped the other."""
    return RECORD in (meta.get("annotations") or {}) or RECORD in (meta.get("labels") or {})


def _in(collection: str, namespace: str) -> str:
    """``/apis/<group>/<version>/<plural>`` of one namespace."""
    head, plural = collection.rsplit("/", 1)
    return f"{head}/namespaces/{namespace}/{plural}"

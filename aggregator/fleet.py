"""The Fleet: one Target per shoot a source names, each supervised alone.

A target that crashes is retried with back-off and reported. What a target that is no
longer wanted held down is the leader's sweep's to restore (aggregator/act/orphans.py): it
survives restarts, and nothing per removed target runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aggregator.act.orphans import Orphans
from aggregator.kube.client import KubeApi, KubeClient
from aggregator.kube.endpoint import KubeconfigSource
from aggregator.lead.scope import Alone, Leadership
from aggregator.model.dependents import Dependent
from aggregator.observe.sources import KubeconfigSecrets, TargetSource, TargetSpec
from aggregator.report import TargetStatus
from aggregator.shoot import Shared
from aggregator.target import Target
from core import logs
from core.errors import KubeError

log = logs.get("fleet")


@dataclass
class Running:
    """One supervised target: what it was started for, and what it reports."""

    spec: TargetSpec
    target: Target | None = None
    error: str = ""
    # When the current life began: why the last one ended is shown until this one has
    # lasted as long as the longest back-off, so a crash loop never looks healthy between crashes.
    # None between lives, while it waits to be restarted.
    life_started: float | None = None
    stopped: bool = False


class Fleet:
    """Runs one Target per desired spec; a failing target is retried alone and reported."""

    def __init__(
        self,
        shared: Shared,
        *,
        leadership: Leadership | None = None,
        watches: KubeApi | None = None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        # What every target is built with beside its own shoot and scope; the fleet's own work
        # (the sweep, the sources) uses its settings, seed client and metrics too.
        self.shared = shared
        self.settings = shared.settings
        # The seed client the kubeconfig Secrets' watch runs on (aggregator.__main__.SeedClients).
        self.watches = watches or shared.seed
        # Who acts for which target (the leader, its shard's holder, or this replica alone): a
        # target is acted for, and a record left in its namespace swept, in the same scope (one
        # writer for both).
        self.leadership = leadership or Alone()
        # Told when targets start or stop (aggregator/ops/heap.py).
        self.on_change = on_change
        self.running: dict[str, Running] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.source_error = ""
        self.reconciled = asyncio.Event()
        # One watch per kubeconfig Secret name (one in Gardener), shared by every target.
        self.secrets: dict[str, KubeconfigSecrets] = {}
        self._watch_tasks: list[asyncio.Task[None]] = []
        self._source: TargetSource | None = None
        self.orphans = self._orphans()

    def _orphans(self) -> Orphans:
        return Orphans(
            self.shared.seed,
            self.shared.dependents,
            self.settings,
            self.shared.metrics,
            served=self.served,
            skipped_because=self.skipped_because,
            dependents_of=self.dependents_of,
            leadership=self.leadership,
        )

    def served(self) -> set[str] | None:
        """The namespaces served now; None until the source has answered, or while it fails (then
        no record may be taken for an orphan)."""
        if not self.reconciled.is_set() or self.source_error:
            return None
        return {r.spec.namespace for r in self.running.values()}

    def health_of(self, namespace: str) -> tuple[TargetStatus | None, str]:
        """The status of the target serving ``namespace`` (None before its first verdict) and
        the error its last life ended with, while that is still shown ("" for none)."""
        r = next((r for r in self.running.values() if r.spec.namespace == namespace), None)
        if r is None:
            return None, "no target serves this shoot"
        error = r.error if r.error and not self._recovered(r) else ""
        return (r.target.status if r.target is not None else None), error

    def unready(self) -> str:
        """Why this aggregator is not ready (``/readyz``); "" when it is: the targets' source has
        answered and does not fail now (a targets file that broke after start keeps the last
        good set running, and says so here)."""
        if not self.reconciled.is_set():
            return "the targets' source has not answered yet"
        if self.source_error:
            return f"the targets are unavailable: {self.source_error}"
        return ""

    def dependents_of(self, namespace: str) -> Sequence[Dependent]:
        """The dependents the target serving ``namespace`` acts on: its shoot's own, or the seed's."""
        spec = next((r.spec for r in self.running.values() if r.spec.namespace == namespace), None)
        return self._dependents(spec)

    def _dependents(self, spec: TargetSpec | None) -> Sequence[Dependent]:
        protection = None if spec is None else spec.protection
        if protection is None or protection.dependents is None:
            return self.shared.dependents
        return protection.dependents

    def shared_for(self, spec: TargetSpec) -> Shared:
        """What the target of ``spec`` is built with: its shoot's providerConfig over the seed's."""
        protection = spec.protection
        if protection is None:
            return self.shared
        settings = protection.over(self.settings)
        return replace(self.shared, settings=settings, dependents=self._dependents(spec))

    def skipped_because(self, namespace: str) -> str:
        """Why the namespace's owner decides its controllers now: the source skips its Cluster
        (hibernated, deleting, migrating, ...); "" when nothing says so."""
        return str(getattr(self._source, "skipped", {}).get(namespace, ""))

    async def run(self, source: TargetSource) -> None:
        self._source = source
        sweep = asyncio.create_task(self.orphans.run(), name="orphans")
        feed = asyncio.create_task(source.run(), name="targets-source")
        # Every target's dependents by one watch each across the seed, when the composition root
        # made it (aggregator.__main__); without it each target reads its own.
        if self.shared.watched is not None:
            self._watch_tasks.append(asyncio.create_task(self.shared.watched.run(), name="seed-dependents"))
        try:
            while True:
                try:
                    desired = await source.desired()
                    self.source_error = ""
                    self._reconcile(desired)
                except KubeError as e:
                    if str(e) != self.source_error:
                        log.error("targets_unavailable", error=str(e))
                    self.source_error = str(e)
                if not self.reconciled.is_set():
                    self.orphans.wake.set()  # what is served is known now: sweep at once
                self.reconciled.set()
                await source.changed(self.settings.shoots.poll_s)
        finally:
            for r in self.running.values():
                r.stopped = True
            tasks = [*self.tasks.values(), sweep, feed, *self._watch_tasks]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _reconcile(self, desired: dict[str, TargetSpec]) -> None:
        if desired != {n: r.spec for n, r in self.running.items()}:
            self.on_change()
        for name in [n for n, r in self.running.items() if n not in desired or desired[n] != r.spec]:
            log.info("target_stopped", target=name)
            stopping = self.running.pop(name)
            spec, stopping.stopped = stopping.spec, True
            self.tasks.pop(name).cancel()
            self.shared.metrics.forget(name)
            if spec.kubeconfig_secret in self.secrets:
                self.secrets[spec.kubeconfig_secret].forget(spec.namespace)
            if name not in desired:
                log.info("target_removed", target=name, namespace=spec.namespace)
                self.orphans.wake.set()  # what it held down is the sweep's now
        for name, spec in desired.items():
            if name not in self.running:
                log.info("target_started", target=name, namespace=spec.namespace)
                running = self.running[name] = Running(spec)
                self.tasks[name] = asyncio.create_task(self._supervise(running), name=f"target/{name}")

    async def _supervise(self, running: Running) -> None:
        """Run one target forever; crashes are reported and retried with back-off, never spread."""
        restart = self.settings.shoots.restart
        delays = restart.delays()
        while True:
            running.life_started = time.monotonic()
            await self._run_target(running)
            if running.stopped:
                # A request that failed as it was cancelled: Python 3.11's TaskGroup raises the
                # failure and drops the cancellation, which a restart here would lose for good.
                return
            if self._recovered(running):
                delays = restart.delays()  # a long life ended: the back-off starts over
            running.life_started = None
            self.shared.metrics.target_errors.inc(target=running.spec.name)
            delay_s = next(delays)
            log.error("target_failed", target=running.spec.name, error=running.error, retry_in=delay_s)
            await asyncio.sleep(restart.spread(delay_s))

    async def _run_target(self, running: Running) -> None:
        """One life of a target, until it fails; why it failed is left in ``running.error``."""
        spec = running.spec
        shoot: KubeClient | None = None
        try:
            shoot = await self._shoot_client(spec)
            target = Target(
                spec.name,
                spec.namespace,
                shoot,
                self.shared_for(spec),
                scope=self.leadership.scope(spec.namespace),
                node_conditions=dict(spec.node_conditions),
            )
            running.target = target
            async with asyncio.TaskGroup() as tg:
                tg.create_task(target.run())
        except* KubeError as group:
            running.error = "; ".join(str(e) for e in group.exceptions)
        except* Exception as group:  # a bug in one target must not take the others down
            running.error = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
            log.exception("target_crashed", target=spec.name)
        finally:
            if shoot is not None:
                await shoot.close()

    async def _shoot_client(self, spec: TargetSpec) -> KubeClient:
        """The target's shoot client, even when its kubeconfig cannot be used now: every request
        then fails with why, the target is blind, and what it finds held down is restored after
        the blind limit (a target that is never built would hold it for good); once the
        kubeconfig is fixed the same client works."""
        if spec.kubeconfig_path:
            return KubeClient(KubeconfigSource(spec.kubeconfig_path))
        secrets = self.secrets.get(spec.kubeconfig_secret)
        if secrets is None:
            secrets = self.secrets[spec.kubeconfig_secret] = KubeconfigSecrets(
                self.watches,
                spec.kubeconfig_secret,
                self.settings.watching,
                self.settings.shoots.shoot_server,
            )
            self._watch_tasks.append(asyncio.create_task(secrets.run(), name=f"secrets/{secrets.name}"))
        return KubeClient(await secrets.kubeconfig(spec.namespace))

    def _recovered(self, running: Running) -> bool:
        started = running.life_started
        return started is not None and time.monotonic() - started >= self.settings.shoots.restart.max_s

    def snapshot(self) -> list[dict[str, Any]]:
        out = []
        for name, r in sorted(self.running.items()):
            snap = r.target.snapshot() if r.target is not None else {"name": name, "phase": "unavailable"}
            if r.error and not self._recovered(r):
                snap["error"] = r.error
            snap.setdefault("namespace", r.spec.namespace)
            out.append(snap)
        return out

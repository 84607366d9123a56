"""The Extension contract's writes: what each Extension of ours asks for, answered in order.

Reconcile (gardenlet's ``gardener.cloud/operation: reconcile``, a new generation, our finalizer
missing, or a status that no longer says what the spec amounts to): our finalizer on and the
annotation off in one conditional write, ``lastOperation`` Reconcile Processing, then Succeeded,
or Error with the providerConfig's problems as ``lastError``, with ``observedGeneration``.
Delete (a deletionTimestamp while our finalizer is on): once the fleet has stopped the shoot's
target, Delete Processing; what we hold down is given back (where the Cluster says gardenlet
decides the controllers, a shoot deleted, hibernated or migrated: our marks handed back,
aggregator/act/scaler.py ``hand_back``; else restored to its recorded replicas, since nobody
else would raise them: an Extension removed in an outage never strands its shoot), Delete
Succeeded, then our finalizer dropped; one under way stays Processing, one that failed is Delete
Error, each tried again, the finalizer kept.

Every step is read from the Extension as it is now, so a controller stopped in the middle
(a restart, a new leader) finishes the operation. Only the leader writes (aggregator/lead/).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from aggregator.act.scaler import Scaler
from aggregator.decide.decider import Desired
from aggregator.extension.contract import (
    FINALIZER,
    ExtensionView,
    Outcome,
    claim,
    finished,
    processing,
    release,
    wants_reconcile,
)
from aggregator.extension.source import ExtensionSource
from aggregator.kube.client import KubeClient
from aggregator.lead.scope import Alone, Leadership
from aggregator.model.dependents import Dependent
from aggregator.model.settings import Settings
from core import logs
from core.errors import KubeError, NotLeading

log = logs.get("extension")

Served = Callable[[], "set[str] | None"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    def __init__(
        self,
        seed: KubeClient,
        source: ExtensionSource,
        settings: Settings,
        dependents: Sequence[Dependent],
        *,
        served: Served,
        leadership: Leadership | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = _now,
    ) -> None:
        self.seed = seed
        self.source = source
        self.settings = settings
        self.dependents = tuple(dependents)
        # The namespaces whose targets run now (aggregator/fleet.py): a deletion waits until the
        # shoot's target has stopped, so nothing of ours lowers a controller after the hand-back.
        self.served = served
        self.leadership = leadership or Alone()
        self.clock = clock
        self.wall = wall
        self.errors: dict[str, str] = {}

    async def run(self) -> None:
        """A pass on every change of an Extension, and every ``Shoots.poll_s`` regardless (a
        failed write, a target that has stopped since)."""
        changed = self.source.extensions_changed
        while True:
            changed.clear()
            await self.source.informer.synced.wait()
            await self.reconcile_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.shoots.poll_s):
                    await changed.wait()

    async def reconcile_all(self) -> None:
        for namespace, view in sorted(self.source.extensions.items()):
            if not self.leadership.scope(namespace).leads():
                continue
            try:
                await self.reconcile(view)
                self._settled(view, "")
            except KubeError as e:
                self._settled(view, str(e))

    def _settled(self, view: ExtensionView, error: str) -> None:
        if error != self.errors.get(view.namespace, ""):
            if error:
                log.warning("extension_write_failed", namespace=view.namespace, error=error)
            else:
                log.info("extension_write_recovered", namespace=view.namespace)
        self.errors[view.namespace] = error

    async def reconcile(self, view: ExtensionView) -> None:
        if view.deleting:
            if FINALIZER in view.finalizers:
                await self._delete(view)
            return
        if view.operation not in ("", "reconcile"):
            return  # migrate and restore: not yet (docs/design.md, "The extension controller")
        outcome = Outcome("Reconcile", self.source.problems(view.namespace))
        if not wants_reconcile(view, outcome):
            return
        view = await self._patch(view, claim(view))
        view = await self._status(view, processing("Reconcile", self.wall()))
        await self._status(view, finished(view, outcome, self.wall()))
        log.info(
            "extension_reconciled", namespace=view.namespace, state=outcome.state, error=outcome.description
        )

    async def _delete(self, view: ExtensionView) -> None:
        served = self.served()
        if served is None or view.namespace in served:
            return  # its target still runs (the fleet stops it on the source's next answer)
        if view.last_operation[:2] != ("Delete", "Processing"):
            view = await self._status(view, processing("Delete", self.wall()))
        done, problems = await self._give_back(view.namespace)
        if not done and not problems:
            return  # under way (MCM's scale-up delay, a controller to follow): Processing still
        outcome = Outcome("Delete", problems)
        # Each write answers with the object as written: the finalizers' write is conditional
        # on the resourceVersion the status write gave it.
        view = await self._status(view, finished(view, outcome, self.wall()))
        if problems:
            log.warning("extension_delete_failed", namespace=view.namespace, error=outcome.description)
            return
        await self._patch(view, release(view))
        log.info("extension_deleted", namespace=view.namespace)

    async def _give_back(self, namespace: str) -> tuple[bool, tuple[str, ...]]:
        """Every dependent of the shoot's and the seed's handed back to its owner, or restored
        where it has none deciding: whether that has finished, and what failed."""
        own = self.source.config(namespace)
        names = {d.name for d in self.dependents}
        extra = [d for d in (own.dependents or ()) if d.name not in names] if own is not None else []
        scaler = Scaler(
            self.seed,
            namespace,
            [*self.dependents, *extra],
            settings=self.settings.scaling,
            label=namespace,
            scope=self.leadership.scope(namespace),
            clock=self.clock,
        )
        try:
            if owner := self.source.skipped.get(namespace, ""):
                done = await scaler.hand_back(f"its Extension is being deleted ({owner}): our marks go")
            else:
                done = await scaler.converge(
                    Desired.RUNNING, "its Extension is being deleted: restoring what was scaled down"
                )
        finally:
            await scaler.close()
        if done or self.settings.scaling.dry_run:
            return True, ()  # a dry run wrote no mark, and writes none
        return False, tuple(f"{name}: {error}" for name, error in sorted(scaler.errors.items()))

    async def _patch(self, view: ExtensionView, body: dict[str, Any]) -> ExtensionView:
        return ExtensionView.from_object(await self._write(view, view.path, body))

    async def _status(self, view: ExtensionView, body: dict[str, Any]) -> ExtensionView:
        return ExtensionView.from_object(await self._write(view, view.path + "/status", body))

    async def _write(self, view: ExtensionView, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One merge patch within the leader's term (aggregator/lead/scope.py)."""
        scope = self.leadership.scope(view.namespace)
        remaining = scope.term_end() - self.clock()
        if not scope.leads() or remaining <= 0:
            raise NotLeading("not the leader: no writes")
        with scope.writes.write(path):
            try:
                async with asyncio.timeout(remaining):
                    return await self.seed.merge_patch(path, body)
            except TimeoutError as e:
                raise NotLeading(f"leadership ended during a write to {path}") from e

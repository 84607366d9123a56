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
Error, each tried again, the finalizer kept. A Shoot confirmed for force deletion (its Cluster's
``confirmation.gardener.cloud/force-deletion``) has its shoot part deleted without waiting for
the resource manager to clean the shoot, which may be beyond reach; the marks still go first.

Every step is read from the Extension as it is now, so a controller stopped in the middle
(a restart, a new leader) finishes the operation; an Extension as it was before one of our own
writes (the informer's cache a moment behind) is not acted on. Only the leader writes (aggregator/lead/).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from aggregator.act.scaler import Scaler
from aggregator.extension import monitoring
from aggregator.extension.contract import (
    CONFIGURATION_PROBLEM,
    FINALIZER,
    WAIT_FOR_STATE,
    ExtensionView,
    Outcome,
    claim,
    finished,
    operation_type,
    processing,
    release,
    restored,
)
from aggregator.extension.delivery import (
    OBJECTS_SECRET,
    ShootPart,
    access_secret,
    managed_resource,
    managed_resource_path,
    objects_secret,
    secret_path,
)
from aggregator.extension.health import HEARTBEAT, LEASES, Health, Judged, health, heartbeat, unserved
from aggregator.extension.retries import Retries
from aggregator.extension.source import ExtensionSource
from aggregator.kube.client import KubeApi
from aggregator.lead.scope import Alone, Leadership
from aggregator.model.dependents import Dependent
from aggregator.model.settings import Settings
from aggregator.model.verdict import Desired
from core import logs
from core.errors import Conflict, KubeError, NotFound, NotLeading

log = logs.get("extension")

Served = Callable[[], "set[str] | None"]
HealthOf = Callable[[str], "tuple[Judged | None, str]"]
# Gardener's heartbeat controller renews every 30 s by default.
HEARTBEAT_S = 30.0
KEEP_OBJECTS = {"spec": {"keepObjects": True}}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _create_or_merge(seed: KubeApi, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` created at ``path``, or merged over what is there (what it says is ours to say)."""
    try:
        return await seed.create(path.rsplit("/", 1)[0], body)
    except Conflict:
        return await seed.merge_patch(path, body)


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Reconciler:
    def __init__(
        self,
        seed: KubeApi,
        source: ExtensionSource,
        settings: Settings,
        dependents: Sequence[Dependent],
        *,
        served: Served,
        part: ShootPart | None = None,
        health_of: HealthOf | None = None,
        heartbeat_ns: str | None = None,
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
        # What every served shoot gets (DWD_SHOOT_OBJECTS); None: nothing delivered.
        self.part = part
        # A served shoot's target status and the error its last life ended with (the fleet's).
        self.health_of = health_of
        # Where the heartbeat Lease is (the controller's own namespace); None: no heartbeat.
        self.heartbeat_ns = heartbeat_ns
        self._beat_at = -math.inf
        self.leadership = leadership or Alone()
        self.clock = clock
        self.wall = wall
        self.errors: dict[str, str] = {}
        # By namespace, the resourceVersions our own writes went past: the informer's cache may
        # hold one of those a moment longer, and acting on it would run a finished step again
        # (a migration's Succeeded written over with Processing).
        self.superseded: dict[str, collections.deque[str]] = {}
        # The namespaces looked at since this replica began to lead them: the first look
        # reconciles what did not succeed, as the library's predicates do on an informer's start.
        self.looked: set[str] = set()
        self.retries = Retries(settings.shoots.retry)

    async def run(self) -> None:
        """A pass on every change of an Extension, and every ``ShootSettings.poll_s`` regardless (a
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
                self.looked.discard(namespace)
                continue
            try:
                await self.reconcile(view)
                # As the cache has it now: what reconcile wrote may not have come back yet.
                now = self.source.extensions.get(namespace, view)
                if not self._superseded(now):
                    await self.report(now)
                self._settled(view, "")
            except KubeError as e:
                self._settled(view, str(e))
        await self.beat()

    async def report(self, view: ExtensionView) -> None:
        """The shoot's protection as a condition gardenlet merges into the Shoot's status,
        written when it says something new; nothing while the Extension is deleted, migrated or
        waits for its state (the healthcheck library leaves those alone too)."""
        migrating = view.operation == "migrate" or view.last_operation[0] == "Migrate"
        if self.health_of is None or view.deleting or view.operation == WAIT_FOR_STATE or migrating:
            return
        said = self._health(view.namespace)
        if said is None or said.said_by(view.health):
            return
        await self._status(view, {"status": {"conditions": [said.condition(self.wall(), view.health)]}})
        log.info("extension_health", namespace=view.namespace, status=said.status, reason=said.reason)

    def _health(self, namespace: str) -> Health | None:
        served = self.served()
        if served is None:
            return None
        if namespace not in served:
            return unserved(self.source.skipped.get(namespace, ""), self.source.unserved.get(namespace, ""))
        assert self.health_of is not None
        config = self.source.config(namespace)  # its dry run where it sets one, else the seed's
        own = config.dry_run if config is not None else None
        dry_run = self.settings.scaling.dry_run if own is None else own
        return health(*self.health_of(namespace), dry_run=dry_run)

    async def beat(self) -> None:
        """The heartbeat Lease, every ``HEARTBEAT_S``, by a replica that leads: gardenlet reads an
        Extension's conditions as outdated once it is older than its threshold."""
        if self.heartbeat_ns is None or not self.leadership.leading():
            return
        if self.clock() - self._beat_at < HEARTBEAT_S:
            return
        lease = heartbeat(self.heartbeat_ns, self.source.type, int(HEARTBEAT_S), _micro_now())
        path = LEASES.format(ns=self.heartbeat_ns) + "/" + HEARTBEAT
        try:
            async with asyncio.timeout(HEARTBEAT_S):
                await _create_or_merge(self.seed, path, lease)
        except (KubeError, TimeoutError) as e:
            log.warning("extension_heartbeat_failed", error=str(e) or "timed out")
            return
        self._beat_at = self.clock()

    def _superseded(self, view: ExtensionView) -> bool:
        """Whether our own write went past ``view``: the cache brings the object as it is."""
        return view.resource_version in self.superseded.get(view.namespace, ())

    def _settled(self, view: ExtensionView, error: str) -> None:
        if error != self.errors.get(view.namespace, ""):
            if error:
                log.warning("extension_write_failed", namespace=view.namespace, error=error)
            else:
                log.info("extension_write_recovered", namespace=view.namespace)
        self.errors[view.namespace] = error

    async def reconcile(self, view: ExtensionView) -> None:
        """One Extension's operation, as the library's reconciler chooses it: none while it waits
        for its state or its shoot has failed, then migrate, delete, restore or reconcile."""
        if self._superseded(view):
            return
        if view.operation == WAIT_FOR_STATE:
            return
        cluster = self.source.clusters.clusters.get(view.namespace)
        if cluster is not None and cluster.failed:
            return
        first_look = view.namespace not in self.looked
        self.looked.add(view.namespace)
        kind = operation_type(view)
        if kind == "Migrate":
            await self._migrate(view)
            return
        if view.last_operation[:2] == ("Migrate", "Succeeded") and kind != "Restore":
            return  # the shoot is the next seed's now: only a restore makes it ours again
        if view.deleting:
            if FINALIZER in view.finalizers and self.retries.due(view, self.clock()):
                await self._delete(view)
            return
        if not self.retries.asked(view, self.clock(), first_look=first_look):
            return
        problems = self.source.problems(view.namespace)
        outcome = Outcome(kind, problems, (CONFIGURATION_PROBLEM,) if problems else ())
        view = await self._patch(view, claim(view))
        view = await self._status(view, processing(kind, self.wall()))
        if not outcome.problems:
            delivered = await self._deliver(view.namespace)
            if delivered is None:
                self.retries.under_way(view, self.clock())
                return  # the shoot part being taken away: Processing until it has gone
            outcome = Outcome(kind, delivered)
        view = await self._status(view, finished(view, outcome, self.wall()))
        self.retries.finished(view, self.clock(), failed=bool(outcome.problems))
        if kind == "Restore" and not outcome.problems:
            await self._patch(view, restored(view))
        log.info(
            "extension_reconciled",
            namespace=view.namespace,
            operation=kind,
            state=outcome.state,
            error=outcome.description,
        )

    async def _deliver(self, namespace: str) -> tuple[str, ...] | None:
        """The shoot part delivered, left as it is in a hibernated shoot (its API server and
        resource manager may be gone; the shoot extensions skip their shoot resources there too),
        or taken away where its owner turned protection off: the problems met, for
        ``lastError``; None while it is being taken away."""
        if self.part is None:
            return ()
        config = self.source.config(namespace)
        cluster = self.source.clusters.clusters.get(namespace)
        if cluster is not None and cluster.lifecycle.stop == "hibernated":
            return ()
        if config is not None and config.disabled:
            gone, problems = await self._remove(namespace, keep_objects=False)
            return problems if problems or gone else None
        try:
            for body in (access_secret(namespace, self.part), objects_secret(namespace, self.part)):
                await self._apply(namespace, secret_path(namespace, body["metadata"]["name"]), body)
            await self._apply(namespace, managed_resource_path(namespace), managed_resource(namespace))
            await self._monitoring(namespace)
        except NotLeading:
            raise
        except KubeError as e:
            return (f"delivering the shoot part: {e}",)
        return ()

    async def _monitoring(self, namespace: str) -> None:
        """The shoot's own alerts beside its shoot part (aggregator/extension/monitoring.py),
        where the controller's namespace is known; a seed without prometheus-operator's CRDs
        gets none, and says so: protection does not wait on monitoring."""
        if self.heartbeat_ns is None:
            return
        bodies = (
            monitoring.service_monitor(namespace, self.heartbeat_ns),
            monitoring.prometheus_rule(namespace),
        )
        try:
            for path, body in zip(monitoring.paths(namespace), bodies, strict=True):
                await self._apply(namespace, path, body)
        except NotFound as e:
            log.warning("shoot_monitoring_not_delivered", namespace=namespace, error=str(e))

    async def _remove(
        self, namespace: str, *, keep_objects: bool, wait: bool = True
    ) -> tuple[bool, tuple[str, ...]]:
        """The ManagedResource deleted (its objects left in the shoot with ``keep_objects``), then
        its Secrets once the resource manager has let it go (at once without ``wait``, as
        Gardener's force deletion has it: the shoot may be beyond reach, and gardenlet finalizes
        what is left): whether all of it is gone, and the problem met."""
        if self.part is None:
            return True, ()
        call = partial(self._call, namespace)
        try:
            for own in monitoring.paths(namespace):
                with contextlib.suppress(NotFound):
                    await call(own, partial(self.seed.delete, own))
            path = managed_resource_path(namespace)
            with contextlib.suppress(NotFound):
                if keep_objects:
                    await call(path, partial(self.seed.merge_patch, path, KEEP_OBJECTS))
                await call(path, partial(self.seed.delete, path))
                if wait:
                    return False, ()  # the resource manager's finalizer: gone on a later pass
            for secret in (
                secret_path(namespace, OBJECTS_SECRET),
                secret_path(namespace, self.part.access_secret),
            ):
                with contextlib.suppress(NotFound):
                    await call(secret, partial(self.seed.delete, secret))
        except NotLeading:
            raise
        except KubeError as e:
            return False, (f"removing the shoot part: {e}",)
        return True, ()

    async def _apply(self, namespace: str, path: str, body: dict[str, Any]) -> None:
        await self._call(namespace, path, partial(_create_or_merge, self.seed, path, body))

    async def _migrate(self, view: ExtensionView) -> None:
        """gardenlet moves the shoot's control plane to another seed: our target stops (the
        Cluster says Migrate, what we hold is handed back), the ManagedResource goes with its
        objects kept in the shoot, for the next seed's controller to take over on ``restore``;
        then our finalizer and the annotation."""
        served = self.served()
        if served is None or view.namespace in served:
            return
        if view.last_operation[:2] != ("Migrate", "Processing"):
            view = await self._status(view, processing("Migrate", self.wall()))
        gone, problems = await self._remove(view.namespace, keep_objects=True)
        if problems:
            await self._status(view, finished(view, Outcome("Migrate", problems), self.wall()))
            return
        if not gone:
            return
        view = await self._status(view, finished(view, Outcome("Migrate"), self.wall()))
        await self._patch(view, release(view, every=True))
        log.info("extension_migrated", namespace=view.namespace)

    async def _delete(self, view: ExtensionView) -> None:
        served = self.served()
        if served is None or view.namespace in served:
            return  # its target still runs (the fleet stops it on the source's next answer)
        if view.last_operation[:2] != ("Delete", "Processing"):
            view = await self._status(view, processing("Delete", self.wall()))
        cluster = self.source.clusters.clusters.get(view.namespace)
        force = cluster is not None and cluster.force_deletion
        removed, problem = await self._remove(view.namespace, keep_objects=False, wait=not force)
        done, problems = await self._give_back(view.namespace)
        problems = problem + problems
        if force and (problems or not done):
            # Gardener's ForceDelete "should still succeed, even if some resources are orphaned":
            # the shoot goes whole, and its force deletion must not wait on our marks.
            log.warning("extension_force_deleted_orphaning", namespace=view.namespace, left=problems)
            done, problems = True, ()
        if not (done and removed) and not problems:
            return  # under way (the resource manager deleting, MCM's scale-up delay): Processing still
        outcome = Outcome("Delete", problems)
        # Each write answers with the object as written: the finalizers' write is conditional
        # on the resourceVersion the status write gave it.
        view = await self._status(view, finished(view, outcome, self.wall()))
        self.retries.finished(view, self.clock(), failed=bool(problems))
        if problems:
            log.warning("extension_delete_failed", namespace=view.namespace, error=outcome.description)
            return
        await self._patch(view, release(view))
        log.info("extension_deleted", namespace=view.namespace, force=force)

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
        written = await self._call(view.namespace, path, lambda: self.seed.merge_patch(path, body))
        self.superseded.setdefault(view.namespace, collections.deque(maxlen=16)).append(view.resource_version)
        return written

    async def _call(
        self, namespace: str, path: str, write: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """One write within the leader's term (aggregator/lead/scope.py)."""
        scope = self.leadership.scope(namespace)
        remaining = scope.term_end() - self.clock()
        if not scope.leads() or remaining <= 0:
            raise NotLeading("not the leader: no writes")
        with scope.writes.write(path):
            try:
                async with asyncio.timeout(remaining):
                    return await write()
            except TimeoutError as e:
                raise NotLeading(f"leadership ended during a write to {path}") from e

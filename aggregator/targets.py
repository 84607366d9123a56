"""Where the shoots come from: the environment, a YAML file, or Gardener's Cluster objects.

Every source answers one question, "which targets should run now?"; the Fleet
starts and stops Target tasks to match. A target's kubeconfig comes from a
file, or from a Secret in its control-plane namespace that is re-read every
``SECRET_REFRESH_S`` (and at once after a 401), so rotated credentials keep
working.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from aggregator.decider import Desired
from aggregator.dependents import Dependent
from aggregator.kube import Endpoint, KubeClient, KubeconfigSource, load_kubeconfig_dict
from aggregator.metrics import AggregatorMetrics
from aggregator.scaler import Scaler
from aggregator.settings import Settings
from aggregator.target import Target
from core import logs
from core.errors import KubeconfigError, KubeError, NotFound

log = logs.get("fleet")

SECRET_REFRESH_S = 10.0
SOURCE_POLL_S = 5.0
RETIRE_RETRY_S = 2.0
CLUSTERS = "/apis/extensions.gardener.cloud/v1alpha1/clusters"


@dataclass(frozen=True)
class TargetSpec:
    name: str
    namespace: str
    kubeconfig_path: str = ""
    kubeconfig_secret: str = ""


class TargetSource(Protocol):
    async def desired(self) -> dict[str, TargetSpec]: ...


@dataclass
class EnvSource:
    spec: TargetSpec

    async def desired(self) -> dict[str, TargetSpec]:
        return {self.spec.name: self.spec}


@dataclass
class FileSource:
    """``targets: [{namespace: shoot--p--a, kubeconfigSecret: name}, {namespace: ..., kubeconfig: /path}]``"""

    path: str
    default_secret: str

    async def desired(self) -> dict[str, TargetSpec]:
        try:
            raw = yaml.safe_load(await asyncio.to_thread(Path(self.path).read_text))
        except (OSError, yaml.YAMLError) as e:
            raise KubeconfigError(f"targets file {self.path}: {e}") from e
        items = raw.get("targets") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise KubeconfigError(f"targets file {self.path}: expected a list under 'targets'")
        out = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not item.get("namespace"):
                raise KubeconfigError(f"targets file {self.path}: entry {i} needs a namespace")
            ns = str(item["namespace"])
            out[str(item.get("name") or ns)] = TargetSpec(
                name=str(item.get("name") or ns),
                namespace=ns,
                kubeconfig_path=str(item.get("kubeconfig") or ""),
                kubeconfig_secret=""
                if item.get("kubeconfig")
                else str(item.get("kubeconfigSecret") or self.default_secret),
            )
        return out


def cluster_skip_reason(cluster: dict[str, Any]) -> str:
    """Why a Gardener Cluster gets no prober ("" when it gets one): dependency-watchdog's rules."""
    if (cluster.get("metadata") or {}).get("deletionTimestamp"):
        return "deleting"
    shoot = (cluster.get("spec") or {}).get("shoot") or {}
    spec, status = shoot.get("spec") or {}, shoot.get("status") or {}
    if (spec.get("hibernation") or {}).get("enabled") or status.get("isHibernated"):
        return "hibernated"
    if not ((spec.get("provider") or {}).get("workers") or []):
        return "worker-less"
    last = status.get("lastOperation") or {}
    if last.get("type") in ("Migrate", "Restore") and last.get("state") != "Succeeded":
        return "migrating"
    if not last or (last.get("type") == "Create" and last.get("state") != "Succeeded"):
        return "not yet reconciled"
    return ""


@dataclass
class GardenerSource:
    seed: KubeClient
    secret: str
    skipped: dict[str, str] = field(default_factory=dict)

    async def desired(self) -> dict[str, TargetSpec]:
        clusters = (await self.seed.get(CLUSTERS)).get("items") or []
        out, skipped = {}, {}
        for c in clusters:
            name = str((c.get("metadata") or {}).get("name") or "")
            if not name:
                continue
            why = cluster_skip_reason(c)
            if why:
                skipped[name] = why
                continue
            out[name] = TargetSpec(name=name, namespace=name, kubeconfig_secret=self.secret)
        if skipped != self.skipped:
            log.info("clusters_skipped", skipped=skipped)
        self.skipped = skipped
        return out


class SecretKubeconfig:
    """An endpoint source fed from a Secret's ``kubeconfig`` key, refreshed by ``refresh()``."""

    def __init__(self, seed: KubeClient, namespace: str, name: str) -> None:
        self.seed = seed
        self.path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        self.source = f"secret {namespace}/{name}"
        self._endpoint: Endpoint | None = None
        self._data = ""
        self.error = ""

    def __call__(self) -> Endpoint:
        if self._endpoint is None:
            raise KubeconfigError(f"kubeconfig {self.source}: {self.error or 'not read yet'}")
        return self._endpoint

    async def refresh(self) -> bool:
        """Re-read the secret; True when the credentials changed."""
        try:
            secret = await self.seed.get(self.path)
        except NotFound as e:
            self.error = "the secret does not exist"
            raise KubeconfigError(f"kubeconfig {self.source}: the secret does not exist") from e
        encoded = (secret.get("data") or {}).get("kubeconfig")
        if not encoded:
            self.error = "no 'kubeconfig' key"
            raise KubeconfigError(f"kubeconfig {self.source}: no 'kubeconfig' key")
        if encoded == self._data and self._endpoint is not None:
            return False
        try:
            raw = yaml.safe_load(base64.b64decode(encoded))
        except (binascii.Error, ValueError, yaml.YAMLError) as e:
            self.error = f"cannot be decoded: {e}"
            raise KubeconfigError(f"kubeconfig {self.source}: cannot be decoded: {e}") from e
        self._endpoint = load_kubeconfig_dict(raw, self.source)
        self._data, self.error = encoded, ""
        return True


@dataclass
class Running:
    """One supervised target: what it was started for, and what it reports."""

    spec: TargetSpec
    target: Target | None = None
    error: str = ""


class Fleet:
    """Runs one Target per desired spec; a failing target is retried alone and reported."""

    def __init__(
        self,
        settings: Settings,
        seed: KubeClient,
        dependents: Sequence[Dependent],
        metrics: AggregatorMetrics,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        term_end: Callable[[], float] = lambda: math.inf,
    ) -> None:
        self.settings = settings
        self.seed = seed
        self.dependents = dependents
        self.metrics = metrics
        self.is_leader = is_leader
        self.term_end = term_end
        self.running: dict[str, Running] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        # Targets no longer wanted: what they scaled down is restored (retire()).
        self.retiring: dict[str, asyncio.Task[None]] = {}
        self.source_error = ""
        self.reconciled = asyncio.Event()

    async def run(self, source: TargetSource) -> None:
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
                self.reconciled.set()
                await asyncio.sleep(SOURCE_POLL_S)
        finally:
            tasks = [*self.tasks.values(), *self.retiring.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _reconcile(self, desired: dict[str, TargetSpec]) -> None:
        for name in [n for n, r in self.running.items() if n not in desired or desired[n] != r.spec]:
            log.info("target_stopped", target=name)
            spec = self.running.pop(name).spec
            self.tasks.pop(name).cancel()
            self.metrics.forget(name)
            if name not in desired:
                self.retiring[name] = asyncio.create_task(self.retire(spec), name=f"retire/{name}")
        for name, spec in desired.items():
            if name in self.retiring:
                self.retiring.pop(name).cancel()  # wanted again: its own target takes over
            if name not in self.running:
                log.info("target_started", target=name, namespace=spec.namespace)
                running = self.running[name] = Running(spec)
                self.tasks[name] = asyncio.create_task(self._supervise(running), name=f"target/{name}")

    async def retire(self, spec: TargetSpec) -> None:
        """A target that is no longer wanted must not leave its controllers at 0: after the
        recovery period, restore whatever carries its record, until that is done."""
        await asyncio.sleep(self.settings.recovery_period_s)
        scaler = Scaler(self.seed, spec.namespace, self.dependents, label=spec.name, deadline=self.term_end)
        reason = "the target was removed from the aggregator: restoring what it scaled down"
        while True:
            if self.is_leader() and await scaler.converge(Desired.RUNNING, reason):
                break
            await asyncio.sleep(RETIRE_RETRY_S)
        log.info("target_retired", target=spec.name)
        self.retiring.pop(spec.name, None)

    async def _supervise(self, running: Running) -> None:
        """Run one target forever; crashes are reported and retried with back-off, never spread."""
        backoff_s = 2.0
        spec = running.spec
        while True:
            shoot: KubeClient | None = None
            try:
                shoot, refresher = await self._shoot_client(spec)
                target = Target(
                    spec.name,
                    spec.namespace,
                    shoot,
                    self.seed,
                    settings=self.settings,
                    dependents=self.dependents,
                    is_leader=self.is_leader,
                    term_end=self.term_end,
                    metrics=self.metrics,
                )
                running.target, running.error = target, ""
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(target.run())
                    if refresher is not None:
                        tg.create_task(refresher(target))
            except* KubeError as group:
                running.error = "; ".join(str(e) for e in group.exceptions)
            except* Exception as group:  # a bug in one target must not take the others down
                running.error = "; ".join(f"{type(e).__name__}: {e}" for e in group.exceptions)
                log.exception("target_crashed", target=spec.name)
            finally:
                if shoot is not None:
                    await shoot.close()
            self.metrics.target_errors.inc(target=spec.name)
            log.error("target_failed", target=spec.name, error=running.error, retry_in=backoff_s)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 60.0)

    async def _shoot_client(self, spec: TargetSpec) -> tuple[KubeClient, Callable[[Target], Any] | None]:
        if spec.kubeconfig_path:
            source = KubeconfigSource(spec.kubeconfig_path)
            source()  # a missing or broken file is reported now, not on the first watch
            return KubeClient(source), None
        secret = SecretKubeconfig(self.seed, spec.namespace, spec.kubeconfig_secret)
        await secret.refresh()

        async def refresh_forever(target: Target) -> None:
            while True:
                await asyncio.sleep(SECRET_REFRESH_S)
                with contextlib.suppress(KubeError):
                    if await secret.refresh():
                        # Every request from now on, and every watch when it restarts,
                        # uses the new credentials.
                        log.info("kubeconfig_rotated", target=target.name)

        return KubeClient(secret), refresh_forever

    def snapshot(self) -> list[dict[str, Any]]:
        out = []
        for name, r in sorted(self.running.items()):
            snap = r.target.snapshot() if r.target is not None else {"name": name, "phase": "unavailable"}
            if r.error:
                snap["error"] = r.error
            snap.setdefault("namespace", r.spec.namespace)
            out.append(snap)
        return out

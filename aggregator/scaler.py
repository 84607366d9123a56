"""Scaling the dependent controllers down and back up, through the scale subresource.

Nothing is ever lost: before a resource is scaled to zero its replicas are
written to the ``replicas`` annotation (a crash in between leaves the record,
never a zero without one); on the way up exactly that count is restored and
only then are the annotations removed. Every step is idempotent, so a
restarted aggregator simply runs the same direction again.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aggregator.dependents import Dependent, levels
from aggregator.kube import KubeClient
from core import logs
from core.errors import KubeError, NotFound

PREFIX = "dependency-watchdog.gardener.cloud/"
REPLICAS = PREFIX + "replicas"
MELTDOWN = PREFIX + "meltdown-protection-active"
IGNORE_SCALING = PREFIX + "ignore-scaling"
COMPONENT = "dwd-lease-aggregator"
ATTEMPTS = 3

log = logs.get("scaler")


@dataclass(frozen=True)
class Outcome:
    name: str
    result: str  # scaled, already, ignored, absent, not-ours, failed, dry-run
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.result != "failed"


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _spec_replicas(obj: dict[str, Any]) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


class Scaler:
    def __init__(
        self,
        seed: KubeClient,
        namespace: str,
        dependents: Sequence[Dependent],
        *,
        dry_run: bool = False,
        target: str = "",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        poll_s: float = 0.5,
    ) -> None:
        self.seed = seed
        self.namespace = namespace
        self.dependents = tuple(dependents)
        self.dry_run = dry_run
        self.sleep = sleep
        self.poll_s = poll_s
        self.log = log.bind(target=target or namespace)

    async def protected(self) -> list[str]:
        """Dependents that carry our record of a scale-down: the state a restart continues from."""
        out = []
        for d in self.dependents:
            try:
                obj = await self.seed.get(d.path(self.namespace))
            except NotFound:
                continue
            if REPLICAS in _annotations(obj) or MELTDOWN in _annotations(obj):
                out.append(d.name)
        return out

    async def scale_down(self, reason: str) -> list[Outcome]:
        return await self._run("down", reason)

    async def scale_up(self, reason: str) -> list[Outcome]:
        return await self._run("up", reason)

    async def _run(self, direction: str, reason: str) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for level in levels(self.dependents, direction):
            # A failure at one level does not stop the next: protection (down) and
            # availability (up) are worth more than strict order once attempts are spent.
            outcomes += await asyncio.gather(*(self._one(d, direction, reason) for d in level))
        return outcomes

    async def _one(self, d: Dependent, direction: str, reason: str) -> Outcome:
        step = d.scale_up if direction == "up" else d.scale_down
        if step.initial_delay_s:
            await self.sleep(step.initial_delay_s)
        error: KubeError | None = None
        for attempt in range(ATTEMPTS):
            try:
                if direction == "down":
                    return await self._down(d, reason, step.timeout_s)
                return await self._up(d, reason, step.timeout_s)
            except KubeError as e:
                error = e
                self.log.warning(
                    "scale_attempt_failed",
                    resource=d.name,
                    direction=direction,
                    attempt=attempt + 1,
                    error=str(e),
                )
                await self.sleep(min(1.0 * 2**attempt, 5.0))
        return Outcome(d.name, "failed", str(error))

    async def _down(self, d: Dependent, reason: str, timeout_s: float) -> Outcome:
        path = d.path(self.namespace)
        try:
            obj = await self.seed.get(path)
        except NotFound:
            if d.optional:
                return Outcome(d.name, "absent")
            raise
        ann = _annotations(obj)
        if ann.get(IGNORE_SCALING) == "true":
            self.log.info("scale_skipped", resource=d.name, direction="down", why=IGNORE_SCALING)
            return Outcome(d.name, "ignored")
        replicas = _spec_replicas(obj)
        if replicas == 0 and REPLICAS in ann and MELTDOWN in ann:
            return Outcome(d.name, "already")
        if self.dry_run:
            self.log.info(
                "dry_run_scale", resource=d.name, direction="down", replicas=replicas, reason=reason
            )
            return Outcome(d.name, "dry-run", f"{replicas} -> 0")
        # Record first: a crash after this line leaves the count, never a zero without it.
        record = {MELTDOWN: ""}
        if REPLICAS not in ann:
            record[REPLICAS] = str(replicas)
        await self.seed.merge_patch(path, {"metadata": {"annotations": record}})
        recorded = ann.get(REPLICAS, str(replicas))
        if replicas != 0:
            await self.seed.merge_patch(path + "/scale", {"spec": {"replicas": 0}})
        await self._wait(
            path, lambda o: int((o.get("status") or {}).get("replicas") or 0) == 0, timeout_s, d.name
        )
        self.log.info("resource_scaled_down", resource=d.name, replicas_before=recorded, reason=reason)
        await self._event(
            obj, "ScaledDown", f"Scaled {d.name} from {recorded} to 0 replicas: {reason}", "Warning"
        )
        return Outcome(d.name, "scaled", f"{recorded} -> 0")

    async def _up(self, d: Dependent, reason: str, timeout_s: float) -> Outcome:
        path = d.path(self.namespace)
        try:
            obj = await self.seed.get(path)
        except NotFound:
            return Outcome(d.name, "absent")
        ann = _annotations(obj)
        if ann.get(IGNORE_SCALING) == "true":
            self.log.info("scale_skipped", resource=d.name, direction="up", why=IGNORE_SCALING)
            return Outcome(d.name, "ignored")
        if REPLICAS not in ann:
            if MELTDOWN in ann and not self.dry_run:
                await self.seed.merge_patch(path, {"metadata": {"annotations": {MELTDOWN: None}}})
            return Outcome(d.name, "not-ours")
        try:
            target = int(ann[REPLICAS])
            if target < 0:
                raise ValueError(target)
        except ValueError:
            # dependency-watchdog restores 1 when the record is unusable; say so loudly.
            self.log.error("replicas_annotation_invalid", resource=d.name, value=ann[REPLICAS], restoring=1)
            target = 1
        current = _spec_replicas(obj)
        if self.dry_run:
            self.log.info("dry_run_scale", resource=d.name, direction="up", replicas=target, reason=reason)
            return Outcome(d.name, "dry-run", f"{current} -> {target}")
        if current < target:
            await self.seed.merge_patch(path + "/scale", {"spec": {"replicas": target}})
        ready = await self._wait(
            path,
            lambda o: int((o.get("status") or {}).get("readyReplicas") or 0) >= target,
            timeout_s,
            d.name,
        )
        # Only now is the record dropped: the scale above is done.
        await self.seed.merge_patch(path, {"metadata": {"annotations": {REPLICAS: None, MELTDOWN: None}}})
        self.log.info("resource_scaled_up", resource=d.name, replicas=target, ready=ready, reason=reason)
        await self._event(
            obj, "ScaledUp", f"Scaled {d.name} from {current} to {target} replicas: {reason}", "Normal"
        )
        return Outcome(d.name, "scaled", f"{current} -> {target}")

    async def _wait(
        self, path: str, done: Callable[[dict[str, Any]], bool], timeout_s: float, name: str
    ) -> bool:
        """Poll until ``done`` holds; False (and a warning) after the timeout, never an exception."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if done(await self.seed.get(path)):
                return True
            if loop.time() >= deadline:
                self.log.warning("scale_not_observed", resource=name, timeout_s=timeout_s)
                return False
            await self.sleep(self.poll_s)

    async def _event(self, obj: dict[str, Any], reason: str, message: str, kind: str) -> None:
        meta = obj.get("metadata") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{meta.get('name', 'dwd')}.", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "apps/v1"),
                "kind": obj.get("kind", "Deployment"),
                "name": meta.get("name"),
                "namespace": self.namespace,
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.seed.create(f"/api/v1/namespaces/{self.namespace}/events", event)
        except KubeError as e:
            # An Event is a report, not part of the action: never fail a scale for it.
            self.log.warning("event_failed", reason=reason, error=str(e))

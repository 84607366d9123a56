"""Where the shoots come from: the environment, a YAML file, or Gardener's Cluster objects.

Every source answers one question, "which targets should run now?"; the Fleet
(aggregator/fleet.py) starts and stops Target tasks to match. A target's
kubeconfig comes from a file, or from a Secret in its control-plane namespace
(``SecretKubeconfig``), which the Fleet re-reads now and then so rotated
credentials keep working.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from aggregator.kube import Endpoint, KubeClient, load_kubeconfig_dict
from aggregator.objects import ClusterView, section
from core import logs
from core.errors import KubeconfigError, NotFound

# The sources log as part of the fleet they feed.
log = logs.get("fleet")

CLUSTERS = "/apis/extensions.gardener.cloud/v1alpha1/clusters"


@dataclass(frozen=True)
class TargetSpec:
    name: str
    namespace: str
    kubeconfig_path: str = ""
    kubeconfig_secret: str = ""
    # The shoot's own unhealthy conditions per worker pool (from its Cluster), over the setting's.
    node_conditions: tuple[tuple[str, tuple[str, ...]], ...] = ()


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


@dataclass
class GardenerSource:
    seed: KubeClient
    secret: str
    skipped: dict[str, str] = field(default_factory=dict)

    async def desired(self) -> dict[str, TargetSpec]:
        out, skipped = {}, {}
        for c in await self._clusters():
            if c.skip_reason:
                skipped[c.name] = c.skip_reason
                continue
            # A changed list changes the spec: the Fleet restarts the target with it, as
            # dependency-watchdog restarts its prober (AreWorkerNodeConditionsStale).
            out[c.name] = TargetSpec(
                name=c.name,
                namespace=c.name,
                kubeconfig_secret=self.secret,
                node_conditions=c.node_conditions,
            )
        if skipped != self.skipped:
            log.info("clusters_skipped", skipped=skipped)
        self.skipped = skipped
        return out

    async def _clusters(self) -> list[ClusterView]:
        views = []
        for obj in (await self.seed.get(CLUSTERS)).get("items") or []:
            with contextlib.suppress(ValueError):  # without a name: nothing to run
                views.append(ClusterView.from_object(obj))
        return views


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
        encoded = section(secret, "data").get("kubeconfig")
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

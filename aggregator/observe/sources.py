"""Where the shoots come from: the environment, a YAML file, or Gardener's Cluster objects.

Every source answers one question, "which targets should run now?"; the Fleet
(aggregator/fleet.py) starts and stops Target tasks to match. A target's
kubeconfig comes from a file, or from a Secret in its control-plane namespace.

The seed is watched, not polled: Clusters by one list+watch, each object parsed into its
small view on arrival (a Cluster embeds its Shoot, Seed and CloudProfile: 25 KB; LISTed every
5 s at 250 shoots that was 10 MB of JSON parsed per LIST), and the kubeconfig Secrets by one
watch across the seed selected by their name (polled, 25 GETs/s at 250 shoots while nothing
changed). A change reaches its target within a second.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from aggregator.kube.client import KubeApi
from aggregator.kube.endpoint import Endpoint, load_kubeconfig_dict
from aggregator.model.lifecycle import ClusterView
from aggregator.model.objects import metadata, section
from aggregator.model.protection import ProtectionConfig
from aggregator.model.settings import WatchSettings
from aggregator.observe.watcher import Informer
from core import logs
from core.errors import KubeconfigError, KubeError, unreadable
from core.lease import is_dns_label, is_dns_subdomain

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
    # The shoot's own settings over the seed's (its Extension's providerConfig); None: the seed's.
    protection: ProtectionConfig | None = None


class TargetSource(Protocol):
    async def run(self) -> None:
        """Feed the source (a watch) until cancelled; returns at once if there is nothing to feed."""

    async def desired(self) -> dict[str, TargetSpec]: ...

    async def changed(self, max_wait_s: float) -> None:
        """Return at the next change, or after ``max_wait_s``."""


class Polled:
    """A source read afresh on every ``desired()``: there is no change to wait for."""

    async def run(self) -> None:
        return

    async def changed(self, max_wait_s: float) -> None:
        await asyncio.sleep(max_wait_s)


@dataclass
class EnvSource(Polled):
    spec: TargetSpec

    async def desired(self) -> dict[str, TargetSpec]:
        return {self.spec.name: self.spec}


@dataclass
class FileSource(Polled):
    """``targets: [{namespace: shoot--p--a, kubeconfigSecret: name}, {namespace: ..., kubeconfig: /path}]``"""

    path: str
    default_secret: str

    async def desired(self) -> dict[str, TargetSpec]:
        try:
            raw = yaml.safe_load(await asyncio.to_thread(Path(self.path).read_text))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise KubeconfigError(f"targets file {self.path}: {unreadable(e)}") from e
        items = raw.get("targets") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise KubeconfigError(f"targets file {self.path}: expected a list under 'targets'")
        out: dict[str, TargetSpec] = {}
        for i, item in enumerate(items):
            where = f"targets file {self.path}: entry {i}"
            if not isinstance(item, dict) or not item.get("namespace"):
                raise KubeconfigError(f"{where} needs a namespace")
            ns, name = str(item["namespace"]), str(item.get("name") or item["namespace"])
            if not is_dns_label(ns):
                raise KubeconfigError(f"{where}: {ns!r} is not a valid namespace name (RFC 1123 label)")
            if not is_dns_subdomain(name):
                raise KubeconfigError(f"{where}: name {name!r} is not a valid name (RFC 1123 subdomain)")
            if name in out:
                # Two entries, one target: the last would silently replace the first.
                raise KubeconfigError(f"{where}: target {name!r} is named twice (give each a distinct name)")
            if owner := next((t.name for t in out.values() if t.namespace == ns), None):
                # Two targets on one shoot: both would lower and raise the same controllers.
                raise KubeconfigError(f"{where}: namespace {ns!r} already has target {owner!r}")
            out[name] = TargetSpec(
                name=name,
                namespace=ns,
                kubeconfig_path=str(item.get("kubeconfig") or ""),
                kubeconfig_secret=""
                if item.get("kubeconfig")
                else str(item.get("kubeconfigSecret") or self.default_secret),
            )
        return out


class GardenerSource:
    """Gardener's Cluster objects, by list+watch; dependency-watchdog's rules say which get a
    target (aggregator/model/lifecycle.py): whether a shoot keeps one depends on whether it has one,
    so the source remembers what it served last."""

    # How long a first ``desired()`` waits for the first LIST before it reports the failure.
    FIRST_LIST_S = 10.0

    def __init__(self, seed: KubeApi, secret: str, watching: WatchSettings | None = None) -> None:
        self.secret = secret
        self.watching = watching or WatchSettings()
        self.clusters: dict[str, ClusterView] = {}
        self.skipped: dict[str, str] = {}
        # The clusters the last answer named: a target that runs keeps running through states
        # in which none would start (a reconcile that failed, a restore under way).
        self.serving: set[str] = set()
        self._changed = asyncio.Event()
        self.informer: Informer[ClusterView] = Informer(
            seed,
            CLUSTERS,
            name="clusters",
            parse=ClusterView.from_object,
            on_list=self._listed,
            on_event=self._event,
            settings=self.watching,
            label="seed",
        )

    def _listed(self, views: list[ClusterView]) -> None:
        clusters = {v.name: v for v in views}
        if clusters != self.clusters:
            self.clusters = clusters
            self._changed.set()

    def _event(self, kind: str, view: ClusterView) -> None:
        # Gardener writes a Cluster on every shoot reconcile; only a changed verdict wakes the fleet.
        if kind == "DELETED":
            if self.clusters.pop(view.name, None) is not None:
                self._changed.set()
        elif self.clusters.get(view.name) != view:
            self.clusters[view.name] = view
            self._changed.set()

    async def run(self) -> None:
        await self.informer.run()

    async def changed(self, max_wait_s: float) -> None:
        # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that arrives as the
        # event is set, and the loop around it would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_s):
                await self._changed.wait()
        self._changed.clear()

    async def desired(self) -> dict[str, TargetSpec]:
        """The clusters as watched. Before the first LIST, and while the watch has failed for
        longer than a view stays trusted, the source fails: what it would say may be wrong."""
        informer = self.informer
        if not await informer.first_list(self.FIRST_LIST_S) or not informer.fresh(self.watching.fresh_s):
            raise KubeError(f"clusters: {informer.last_error or 'not listed yet'}")
        out, skipped = {}, {}
        for c in self.clusters.values():
            if why := c.lifecycle.reason(running=c.name in self.serving):
                skipped[c.name] = why
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
        self.skipped, self.serving = skipped, set(out)
        return out


# Where a shoot's API server is reached from the seed, for a Secret that carries only a token and
# the CA bundle: the kube-apiserver Service of the shoot's control-plane namespace (DWD_SHOOT_SERVER).
TOKEN_REQUESTOR_SERVER = "https://kube-apiserver.{namespace}.svc"


class SecretKubeconfig:
    """An endpoint source fed from a Secret's ``kubeconfig`` key, or from the ``token`` and
    ``bundle.crt`` Gardener's token requestor writes (by ``KubeconfigSecrets``)."""

    def __init__(self, namespace: str, name: str, server: str = TOKEN_REQUESTOR_SERVER) -> None:
        self.namespace = namespace
        self.server = server
        self.source = f"secret {namespace}/{name}"
        self._endpoint: Endpoint | None = None
        self._data = ""
        self.error = "not read yet"

    @property
    def has_endpoint(self) -> bool:
        return self._endpoint is not None

    def __call__(self) -> Endpoint:
        if self._endpoint is None:
            raise KubeconfigError(f"kubeconfig {self.source}: {self.error}")
        return self._endpoint

    def update(self, data: Mapping[str, Any] | None) -> bool:
        """Take the Secret's ``data`` (None: the Secret does not exist); True when the
        credentials changed. A bad or missing Secret leaves the endpoint it replaces in use:
        the credentials may still work, and the error is kept for ``__call__`` and the log."""
        if data is None:
            self.error = "the secret does not exist"
            return False
        encoded = data.get("kubeconfig")
        requested = data.get("token") and data.get("bundle.crt")
        if not encoded and not requested:
            self.error = "no 'kubeconfig' key (nor 'token' and 'bundle.crt' from Gardener's token requestor)"
            return False
        seen = str(encoded or f"{data['token']}/{data['bundle.crt']}")
        if seen == self._data and self._endpoint is not None:
            self.error = ""  # back to what is in use: whatever was wrong in between is not
            return False
        try:
            raw = yaml.safe_load(base64.b64decode(encoded)) if encoded else self._requested(data)
            endpoint = load_kubeconfig_dict(raw, self.source, data_only=True)
        except (binascii.Error, ValueError, yaml.YAMLError) as e:
            self.error = f"cannot be decoded: {e}"
            return False
        except KubeconfigError as e:
            self.error = str(e).removeprefix(f"kubeconfig {self.source}: ")  # __call__ names it
            return False
        self._endpoint, self._data, self.error = endpoint, seen, ""
        return True

    def _requested(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """A kubeconfig from what Gardener's token requestor writes into a Secret without one
        (annotated ``inject-ca-bundle``): the token and the shoot's CA bundle; the server is
        the shoot's kube-apiserver Service in its control-plane namespace."""
        token = base64.b64decode(data["token"], validate=True).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "shoot",
            "clusters": [
                {
                    "name": "shoot",
                    "cluster": {
                        "server": self.server.replace("{namespace}", self.namespace),
                        "certificate-authority-data": str(data["bundle.crt"]),
                    },
                }
            ],
            "contexts": [{"name": "shoot", "context": {"cluster": "shoot", "user": "shoot"}}],
            "users": [{"name": "shoot", "user": {"token": token}}],
        }


class KubeconfigSecrets:
    """Every target's kubeconfig Secret of one name, by one watch across the seed
    (``fieldSelector=metadata.name=<name>``, which RBAC's ``resourceNames`` allows): one
    connection for all targets, and a Secret is read again only when it changes."""

    def __init__(
        self,
        seed: KubeApi,
        name: str,
        watching: WatchSettings | None = None,
        server: str = TOKEN_REQUESTOR_SERVER,
    ) -> None:
        self.name = name
        self.server = server
        self.data: dict[str, Mapping[str, Any]] = {}  # namespace -> the Secret's data
        self.kubeconfigs: dict[str, SecretKubeconfig] = {}
        self.informer: Informer[tuple[str, Mapping[str, Any]]] = Informer(
            seed,
            "/api/v1/secrets",
            name=f"secrets/{name}",
            parse=_namespaced_data,
            on_list=self._listed,
            on_event=self._event,
            settings=watching,
            label="seed",
            params={"fieldSelector": f"metadata.name={name}"},
        )

    async def run(self) -> None:
        await self.informer.run()

    async def kubeconfig(self, namespace: str) -> SecretKubeconfig:
        """The namespace's kubeconfig, kept current by the watch. One that cannot be used now
        (the Secrets not listed, the Secret missing, no key, not a kubeconfig) raises why on
        every call, until the watch brings a usable one."""
        await self.informer.first_list(GardenerSource.FIRST_LIST_S)
        kc = self.kubeconfigs.get(namespace)
        if kc is None:
            kc = self.kubeconfigs[namespace] = SecretKubeconfig(namespace, self.name, self.server)
            if self.informer.synced.is_set():
                kc.update(self.data.get(namespace))
            else:  # the watch's first LIST gives it the Secret (``_listed``)
                kc.error = f"secrets {self.name}: {self.informer.last_error or 'not listed yet'}"
        return kc

    def forget(self, namespace: str) -> None:
        self.kubeconfigs.pop(namespace, None)

    def _listed(self, items: list[tuple[str, Mapping[str, Any]]]) -> None:
        self.data = dict(items)
        for namespace, kc in self.kubeconfigs.items():
            self._apply(namespace, kc)

    def _event(self, kind: str, item: tuple[str, Mapping[str, Any]]) -> None:
        namespace, data = item
        if kind == "DELETED":
            self.data.pop(namespace, None)
        else:
            self.data[namespace] = data
        if (kc := self.kubeconfigs.get(namespace)) is not None:
            self._apply(namespace, kc)

    def _apply(self, namespace: str, kc: SecretKubeconfig) -> None:
        before = kc.error
        if kc.update(self.data.get(namespace)):
            # Every request from now on, and every watch when it restarts, uses them.
            log.info("kubeconfig_rotated", target=namespace)
        elif kc.error and kc.error != before:
            log.warning(
                "kubeconfig_unusable", target=namespace, error=kc.error, last_good_kept=kc.has_endpoint
            )


def _namespaced_data(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    namespace = metadata(obj).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("secret without metadata.namespace")
    return namespace, section(obj, "data")

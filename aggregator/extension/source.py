"""Which shoots are served in extension mode: those with an Extension of our type that is not
being deleted, whose Cluster's lifecycle serves them (dependency-watchdog's rules, as in the
gardener mode: aggregator/observe/sources.py ``GardenerSource``), whose providerConfig is valid
and does not opt out. Each target runs with its shoot's providerConfig over the seed's settings.

A providerConfig that turns bad while its shoot is served keeps the last good one in force
(the Extension says the error): a typo must not drop a shoot's protection, nor hand back what
it holds down in the middle of an outage. One that was never good serves nothing: never the
seed's defaults in place of what the owner asked for.
"""

from __future__ import annotations

import asyncio
import contextlib

from aggregator.extension.contract import EXTENSIONS, WAIT_FOR_STATE, ExtensionView
from aggregator.extension.health import DISABLED, INVALID, WAITING
from aggregator.kube.client import KubeApi
from aggregator.model.protection import ProtectionConfig, parse
from aggregator.model.settings import Settings
from aggregator.observe.sources import GardenerSource, TargetSpec
from aggregator.observe.watcher import Informer
from core import logs
from core.errors import ConfigError, KubeError

log = logs.get("fleet")


class ExtensionSource:
    """The Extensions of one type, by list+watch across the seed, over the Clusters' source."""

    def __init__(self, seed: KubeApi, settings: Settings) -> None:
        self.settings = settings
        self.type = settings.shoots.extension_type
        self.clusters = GardenerSource(seed, settings.shoots.kubeconfig_secret, settings.watching)
        self.extensions: dict[str, ExtensionView] = {}  # namespace -> its Extension of our type
        # Namespace -> its providerConfig as parsed now, or the problems with it.
        self.configs: dict[str, ProtectionConfig | ConfigError] = {}
        self.last_good: dict[str, ProtectionConfig] = {}
        # Why gardenlet decides a namespace's controllers now (its Cluster's lifecycle): what the
        # fleet hands our marks back for. An Extension gone, disabled or invalid is not that:
        # nobody else would raise what we hold down, so it is restored (``unserved``, told only).
        self.skipped: dict[str, str] = {}
        self.unserved: dict[str, str] = {}
        self._changed = asyncio.Event()
        # Set on every change of an Extension: the reconciler's wake-up.
        self.extensions_changed = asyncio.Event()
        self.informer: Informer[ExtensionView] = Informer(
            seed,
            EXTENSIONS,
            name="extensions",
            parse=self._parse,
            on_list=self._listed,
            on_event=self._event,
            settings=settings.watching,
            label="seed",
        )

    def _parse(self, obj: object) -> ExtensionView:
        view = ExtensionView.from_object(obj)  # type: ignore[arg-type]
        if view.type != self.type:
            raise ValueError(f"extension of type {view.type!r}, not ours")
        return view

    def _listed(self, views: list[ExtensionView]) -> None:
        self.extensions = {}
        for view in views:
            self._take(view)
        self._wake()

    def _event(self, kind: str, view: ExtensionView) -> None:
        if kind == "DELETED":
            self.extensions.pop(view.namespace, None)
            self.configs.pop(view.namespace, None)
        elif self.extensions.get(view.namespace) == view:
            return
        else:
            self._take(view)
        self._wake()

    def _take(self, view: ExtensionView) -> None:
        self.extensions[view.namespace] = view
        try:
            self.configs[view.namespace] = parse(view.provider_config, self.settings)
        except ConfigError as e:
            self.configs[view.namespace] = e

    def _wake(self) -> None:
        self._changed.set()
        self.extensions_changed.set()

    def problems(self, namespace: str) -> tuple[str, ...]:
        """What is wrong with the namespace's providerConfig now (empty: nothing)."""
        config = self.configs.get(namespace)
        return tuple(config.problems) if isinstance(config, ConfigError) else ()

    def config(self, namespace: str) -> ProtectionConfig | None:
        """The providerConfig in force: the current one, or the last good one while it is bad."""
        config = self.configs.get(namespace)
        return config if isinstance(config, ProtectionConfig) else self.last_good.get(namespace)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.clusters.run(), name="clusters")
            tg.create_task(self.informer.run(), name="extensions")

    async def changed(self, max_wait_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_s):
                waits = [asyncio.create_task(e.wait()) for e in (self._changed, self.clusters._changed)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        self._changed.clear()
        self.clusters._changed.clear()

    async def desired(self) -> dict[str, TargetSpec]:
        """The shoots served now; fails (KubeError) while the Clusters or the Extensions are not
        listed, or their watch has failed for longer than a view stays trusted."""
        informer = self.informer
        if not await informer.first_list(GardenerSource.FIRST_LIST_S) or not informer.fresh(
            self.settings.watching.fresh_s
        ):
            raise KubeError(f"extensions: {informer.last_error or 'not listed yet'}")
        by_clusters = await self.clusters.desired()
        out: dict[str, TargetSpec] = {}
        unserved: dict[str, str] = {}
        for name, spec in by_clusters.items():
            if (why := self._why_not(spec.namespace)) is not None:
                if why:
                    unserved[name] = why
                continue
            out[name] = TargetSpec(
                name=spec.name,
                namespace=spec.namespace,
                kubeconfig_secret=spec.kubeconfig_secret,
                node_conditions=spec.node_conditions,
                protection=self.config(spec.namespace),
            )
        if unserved != self.unserved:
            log.info("shoots_unserved", unserved=unserved)
        # Only what is served keeps serving through the states in which none would start.
        self.clusters.serving = set(out)
        self.skipped, self.unserved = dict(self.clusters.skipped), unserved
        return out

    def _why_not(self, namespace: str) -> str | None:
        """Why the namespace is not served by its Extension ("" when it simply has none of ours);
        None when it is served."""
        view = self.extensions.get(namespace)
        if view is None:
            return ""
        if view.deleting:
            return "its Extension is being deleted"
        if view.operation == WAIT_FOR_STATE:
            return WAITING
        config = self.config(namespace)
        if config is None:
            return f"{INVALID}: " + "; ".join(self.problems(namespace))
        if isinstance(self.configs.get(namespace), ProtectionConfig):
            self.last_good[namespace] = config
        if config.disabled:
            return DISABLED
        return None

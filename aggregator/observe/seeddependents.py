"""Every target's dependents as the seed has them, by one watch per dependent across the seed.

A seed-wide outage has every target read its three dependents at once, and again on every
step towards the target: at 250 shoots that was 1500 GETs on the seed in the seconds that
decide whether KCM stops before its grace period ends, on the same connections as the writes
(bench/seed.py). Watched instead, by name (``fieldSelector=metadata.name=<name>``, one watch
for the kube-controller-manager of every shoot), a step reads nothing: only the writes go to
the seed, and a controller that followed a write is seen as soon as the seed says so.

The watch's view may lag a write by the event's way back, and a missed event could leave it
behind for longer: a write is always conditional on the resourceVersion it was computed from,
so a stale view costs a conflict, and the scaler reads that dependent from the seed after
one; and the scaler remembers every version its writes were computed from, so a view still
showing one of them is known to be behind and not taken for the seed's (a level's gate would
otherwise pass on it: aggregator/act/scaler.py). While a watch is not fresh, before its first
LIST, or for an object it has not seen, the scaler reads as it would without it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from aggregator.kube.client import KubeApi
from aggregator.model.dependents import Dependent
from aggregator.model.objects import metadata
from aggregator.model.settings import WatchSettings
from aggregator.observe.replicas import DependentState
from aggregator.observe.watcher import Informer


def _parse(name: str, obj: Mapping[str, Any]) -> tuple[str, DependentState]:
    namespace = metadata(obj).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"{name} without metadata.namespace")
    try:
        return namespace, DependentState.from_object(name, obj)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{namespace}/{name}: {e}") from e


class SeedDependents:
    def __init__(self, seed: KubeApi, dependents: Sequence[Dependent], watching: WatchSettings) -> None:
        self.watching = watching
        self.states: dict[str, dict[str, DependentState]] = {}  # dependent name -> namespace ->
        self.informers: dict[str, Informer[tuple[str, DependentState]]] = {}
        for d in dependents:
            self.states[d.name] = {}
            self.informers[d.name] = Informer(
                seed,
                d.across(),
                name=f"{d.across().rsplit('/', 1)[1]}/{d.name}",
                parse=functools.partial(_parse, d.name),
                on_list=functools.partial(self._listed, d.name),
                on_event=functools.partial(self._event, d.name),
                settings=watching,
                label="seed",
                params={"fieldSelector": f"metadata.name={d.name}"},
            )

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for name, informer in self.informers.items():
                tg.create_task(informer.run(), name=f"seed-dependents/{name}")

    def get(self, d: Dependent, namespace: str) -> DependentState | None:
        """The dependent as last seen by the watch; None when the watch cannot say: not listed
        yet, not fresh, or no such object in its view (one created a moment ago may be on its
        way: the seed is asked rather than a dependent reported missing)."""
        informer = self.informers.get(d.name)
        if informer is None or not informer.synced.is_set() or not informer.fresh(self.watching.fresh_s):
            return None
        return self.states[d.name].get(namespace)

    def _listed(self, name: str, items: list[tuple[str, DependentState]]) -> None:
        self.states[name] = dict(items)

    def _event(self, name: str, kind: str, item: tuple[str, DependentState]) -> None:
        namespace, state = item
        if kind == "DELETED":
            self.states[name].pop(namespace, None)
        else:
            self.states[name][namespace] = state

"""The actuator's writes are conditional on what it read, on a real API server: a late write of a
deposed leader gets 409 and changes nothing."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from aggregator.act.scaler import Scaler
from aggregator.act.writes import Write
from aggregator.kube.client import KubeClient
from aggregator.kube.endpoint import KubeconfigSource
from aggregator.lead.scope import Scope
from aggregator.model.dependents import DEFAULT_DEPENDENTS
from aggregator.model.records import RECORD, REPLICAS, Record, record_marks
from aggregator.model.settings import WatchSettings
from aggregator.model.verdict import Desired
from aggregator.observe.seeddependents import SeedDependents
from core.errors import Conflict
from testenv.kube.controllers import CONTROLLERS
from testenv.kube.controlplane import ControlPlane, ensure_namespace
from testenv.kube.standins import DEPLOYMENTS, deployment

pytestmark = pytest.mark.integration

NS = "conditional-writes"


@pytest.mark.parametrize("what", ["scale", "record"])
async def test_a_write_on_a_stale_read_conflicts(control_plane: ControlPlane, what: str) -> None:
    kcm = DEFAULT_DEPENDENTS[0]
    with control_plane.admin_client() as admin:
        ensure_namespace(admin, NS)
        admin.ensure(DEPLOYMENTS.format(ns=NS), deployment(kcm.name, 3))
        seed = KubeClient(KubeconfigSource(str(control_plane.kubeconfig)))
        try:
            old_leader = Scaler(seed, NS, [kcm], scope=Scope())
            state = await old_leader.replicas.read(kcm)
            # Meanwhile the new leader records a scale-down.
            admin.merge_patch(kcm.path(NS), {"metadata": {"annotations": record_marks(Record(3))}})
            with pytest.raises(Conflict):
                if what == "scale":
                    await old_leader._write(kcm, Write(replicas=0), state, "late", towards="down")
                else:
                    await old_leader._write(
                        kcm, Write({RECORD: None, REPLICAS: None}), state, "late", towards="up"
                    )
        finally:
            await seed.close()
        after = admin.get(kcm.path(NS))
        assert after["spec"]["replicas"] == 3
        assert after["metadata"]["annotations"][REPLICAS] == "3"
        assert Record.parse(after["metadata"]["annotations"][RECORD]).replicas == 3
        admin.delete(kcm.path(NS))


class CountingGets(KubeClient):
    """The seed client, counting the GETs of one namespace's objects."""

    gets: int = 0

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if method == "GET" and f"/namespaces/{NS}/" in path:
            self.gets += 1
        return await super().request(method, path, **kw)


async def test_with_the_seed_watch_a_scale_down_reads_nothing_and_a_stale_view_costs_one_get(
    control_plane: ControlPlane,
) -> None:
    """The dependents' watch on a real API server: the scale-down's steps read from the watch,
    not the seed; a write by someone else that the watch has not shown yet makes our write
    conflict (it is conditional on the version the watch showed), and that dependent alone is
    read from the seed once and written right."""
    with control_plane.admin_client() as admin:
        ensure_namespace(admin, NS)
        for name, replicas in CONTROLLERS.items():
            admin.ensure(DEPLOYMENTS.format(ns=NS), deployment(name, replicas))
        seed = CountingGets(KubeconfigSource(str(control_plane.kubeconfig)))
        watch = SeedDependents(seed, DEFAULT_DEPENDENTS, WatchSettings())
        watching = asyncio.create_task(watch.run())
        try:
            assert all(await asyncio.gather(*(i.first_list(10) for i in watch.informers.values())))
            # Its next event on the way (the watch stopped, its view still fresh): KCM is
            # raised by someone else.
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            kcm = DEFAULT_DEPENDENTS[0]
            admin.merge_patch(kcm.path(NS) + "/scale", {"spec": {"replicas": 4}})
            scaler = Scaler(
                seed,
                NS,
                DEFAULT_DEPENDENTS,
                scope=Scope(),
                watched=functools.partial(watch.get, namespace=NS),
            )
            # No deployment controller, no status: every dependent has "followed" at once.
            assert await scaler.converge(Desired.SCALED_DOWN, "test") is False  # KCM's write conflicted
            assert seed.gets == 0
            assert await scaler.converge(Desired.SCALED_DOWN, "test") is True
            assert seed.gets == 1  # KCM, after its conflict
            lowered = {
                n: admin.get(f"{DEPLOYMENTS.format(ns=NS)}/{n}")["spec"]["replicas"] for n in CONTROLLERS
            }
            assert lowered == dict.fromkeys(CONTROLLERS, 0)
            after = admin.get(kcm.path(NS))
            assert Record.parse(after["metadata"]["annotations"][RECORD]).replicas == 4
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await seed.close()
            for name in CONTROLLERS:
                admin.delete(f"{DEPLOYMENTS.format(ns=NS)}/{name}")

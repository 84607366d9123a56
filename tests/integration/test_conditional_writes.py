"""The actuator's writes are conditional on what it read, on a real API server: a late write of a
deposed leader gets 409 and changes nothing."""

from __future__ import annotations

import pytest

from aggregator.dependents import DEFAULT_DEPENDENTS
from aggregator.kube import KubeClient, KubeconfigSource
from aggregator.records import RECORD, REPLICAS, Record, record_marks
from aggregator.scaler import Scaler, Write
from core.errors import Conflict
from testenv.controlplane import ControlPlane, ensure_namespace
from testenv.standins import DEPLOYMENTS, deployment

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
            old_leader = Scaler(seed, NS, [kcm])
            state = await old_leader._read(kcm)
            # Meanwhile the new leader records a scale-down.
            admin.merge_patch(kcm.path(NS), {"metadata": {"annotations": record_marks(Record(3))}})
            with pytest.raises(Conflict):
                if what == "scale":
                    await old_leader._write(kcm, Write(replicas=0), state, "late")
                else:
                    await old_leader._write(kcm, Write({RECORD: None, REPLICAS: None}), state, "late")
        finally:
            await seed.close()
        after = admin.get(kcm.path(NS))
        assert after["spec"]["replicas"] == 3
        assert after["metadata"]["annotations"][REPLICAS] == "3"
        assert Record.parse(after["metadata"]["annotations"][RECORD]).replicas == 3
        admin.delete(kcm.path(NS))

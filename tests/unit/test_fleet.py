"""The fleet and its sources against the fake seed: Gardener's Clusters, kubeconfig Secrets,
a target that fails alone and is retried, a source that fails."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
import yaml

from aggregator.fleet import Fleet
from aggregator.metrics import AggregatorMetrics
from aggregator.settings import Backoff, Settings, Shoots
from aggregator.sources import CLUSTERS, EnvSource, GardenerSource, SecretKubeconfig, TargetSpec
from core.errors import KubeconfigError, KubeError
from tests.unit.fakekube import FakeKube
from tests.unit.world import World

SECRET = "/api/v1/namespaces/shoot--p--a/secrets/access"
KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "current-context": "c",
    "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
    "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    "users": [{"name": "u", "user": {"token": "t1"}}],
}


def secret_data(kubeconfig: Any) -> dict[str, Any]:
    return {"data": {"kubeconfig": base64.b64encode(yaml.safe_dump(kubeconfig).encode()).decode()}}


async def test_gardener_source_runs_the_clusters_it_may_and_names_why_not_the_others() -> None:
    seed = FakeKube()
    workers = {"provider": {"workers": [{"name": "pool"}]}}
    done = {"lastOperation": {"type": "Reconcile", "state": "Succeeded"}}
    seed.put(f"{CLUSTERS}/shoot--p--a", {"spec": {"shoot": {"spec": workers, "status": done}}})
    seed.put(f"{CLUSTERS}/shoot--p--b", {"spec": {"shoot": {"spec": {}, "status": done}}})
    source = GardenerSource(seed, "access")  # type: ignore[arg-type]
    assert await source.desired() == {
        "shoot--p--a": TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_secret="access")
    }
    assert source.skipped == {"shoot--p--b": "worker-less"}


async def test_a_secret_kubeconfig_is_read_checked_and_re_read_only_when_it_changed() -> None:
    seed = FakeKube()
    secret = SecretKubeconfig(seed, "shoot--p--a", "access")  # type: ignore[arg-type]
    with pytest.raises(KubeconfigError, match="the secret does not exist"):
        await secret.refresh()
    with pytest.raises(KubeconfigError, match="the secret does not exist"):
        secret()  # nothing loaded yet: every request says why
    seed.put(SECRET, {"data": {}})
    with pytest.raises(KubeconfigError, match="no 'kubeconfig' key"):
        await secret.refresh()
    seed.put(SECRET, {"data": {"kubeconfig": "!!not base64!!"}})
    with pytest.raises(KubeconfigError, match="cannot be decoded"):
        await secret.refresh()
    seed.put(SECRET, secret_data(KUBECONFIG))
    assert await secret.refresh() is True
    assert secret().server == "https://127.0.0.1:1" and secret().headers() == {"Authorization": "Bearer t1"}
    assert await secret.refresh() is False  # unchanged: the same endpoint, the same sessions
    rotated = {**KUBECONFIG, "users": [{"name": "u", "user": {"token": "t2"}}]}
    seed.put(SECRET, secret_data(rotated))
    assert await secret.refresh() is True
    assert secret().headers() == {"Authorization": "Bearer t2"}


class Failing:
    async def desired(self) -> dict[str, TargetSpec]:
        raise KubeError("the seed said no")


QUICK = Settings(Shoots(poll_s=0.02, restart=Backoff(0.01, 0.02)))


async def test_a_target_that_cannot_start_fails_alone_is_retried_and_reported() -> None:
    metrics = AggregatorMetrics()
    fleet = Fleet(QUICK, FakeKube(), World().dependents, metrics)  # type: ignore[arg-type]
    spec = TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_path="/nonexistent/kubeconfig")
    task = asyncio.create_task(fleet.run(EnvSource(spec)))
    try:
        await asyncio.wait_for(fleet.reconciled.wait(), 2)
        await asyncio.sleep(0.2)
        assert metrics.target_errors.get(target="shoot--p--a") >= 2  # retried, not given up
        (snap,) = fleet.snapshot()
        assert snap["phase"] == "unavailable" and "/nonexistent/kubeconfig" in snap["error"]
        assert snap["namespace"] == "shoot--p--a"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert all(t.done() for t in fleet.tasks.values())  # stopping the fleet stops its targets


async def test_a_failing_source_is_reported_and_the_fleet_still_counts_as_reconciled() -> None:
    fleet = Fleet(QUICK, FakeKube(), World().dependents, AggregatorMetrics())  # type: ignore[arg-type]
    task = asyncio.create_task(fleet.run(Failing()))
    try:
        await asyncio.wait_for(fleet.reconciled.wait(), 2)
        assert fleet.source_error == "the seed said no" and fleet.snapshot() == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

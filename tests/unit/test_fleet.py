"""The fleet and its sources against the fake seed: Gardener's Clusters, kubeconfig Secrets,
a target that fails alone and is retried, a source that fails."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from aggregator.fleet import Fleet
from aggregator.kube.endpoint import load_kubeconfig
from aggregator.model.backoff import Backoff
from aggregator.model.settings import Settings, ShootSettings
from aggregator.observe.sources import (
    CLUSTERS,
    TOKEN_REQUESTOR_SERVER,
    EnvSource,
    GardenerSource,
    KubeconfigSecrets,
    Polled,
    SecretKubeconfig,
    TargetSpec,
)
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.shoot import Shared
from core.errors import KubeconfigError, KubeError
from testenv.base.pki import CertificateAuthority
from testenv.gardener.seed_objects import cluster
from tests.unit.fakekube import FakeKube
from tests.unit.world import World

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


@contextlib.asynccontextmanager
async def running(feed: Any) -> AsyncIterator[None]:
    task = asyncio.create_task(feed.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_gardener_source_runs_the_clusters_it_may_and_names_why_not_the_others() -> None:
    seed = FakeKube()
    seed.put(f"{CLUSTERS}/shoot--p--a", cluster("shoot--p--a"))
    seed.put(f"{CLUSTERS}/shoot--p--b", cluster("shoot--p--b", workers=0))
    source = GardenerSource(seed, "access")
    async with running(source):
        assert await source.desired() == {
            "shoot--p--a": TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_secret="access")
        }
        assert source.skipped == {"shoot--p--b": "worker-less"}


async def test_gardener_source_is_watched_a_change_wakes_the_fleet_and_no_list_is_repeated() -> None:
    seed = FakeKube()
    seed.put(f"{CLUSTERS}/shoot--p--a", cluster("shoot--p--a"))
    requests: list[tuple[str, str]] = []
    seed.on_request = lambda method, path: requests.append((method, path))
    hibernated = cluster("shoot--p--a", hibernation=True)
    # The first watch delivers a write that changes nothing (a reconcile), then a hibernation.
    seed.watches = [
        [
            {
                "type": "MODIFIED",
                "object": {**cluster("shoot--p--a"), "metadata": {"name": "shoot--p--a"}},
            }
        ],
        [{"type": "MODIFIED", "object": hibernated}],
    ]
    source = GardenerSource(seed, "access")
    async with running(source):
        assert set(await source.desired()) == {"shoot--p--a"}
        source._changed.clear()  # the first LIST's change has been consumed by the fleet
        started = asyncio.get_running_loop().time()
        await source.changed(5)
        assert asyncio.get_running_loop().time() - started < 1, "a change reaches the fleet at once"
        assert await source.desired() == {} and source.skipped == {"shoot--p--a": "hibernated"}
        await asyncio.sleep(0.1)
    assert requests.count(("GET", CLUSTERS)) == 1, requests  # listed once, then watched


async def test_gardener_source_fails_while_its_watch_is_not_trusted() -> None:
    seed = FakeKube()
    seed.fail("GET", CLUSTERS, lambda: KubeError("clusters are forbidden"))
    source = GardenerSource(seed, "access")
    source.FIRST_LIST_S = 0.2
    async with running(source):
        with pytest.raises(KubeError, match="clusters: clusters are forbidden"):
            await source.desired()


def secret_at(seed: FakeKube, namespace: str, kubeconfig: Any) -> None:
    seed.put(f"/api/v1/namespaces/{namespace}/secrets/access", secret_data(kubeconfig))


async def test_a_secret_kubeconfig_is_checked_and_taken_only_when_it_changed() -> None:
    secret = SecretKubeconfig("shoot--p--a", "access")
    with pytest.raises(KubeconfigError, match="not read yet"):
        secret()  # nothing loaded yet: every request says why
    assert secret.update(None) is False
    with pytest.raises(KubeconfigError, match="the secret does not exist"):
        secret()
    assert secret.update({}) is False
    assert (
        secret.error == "no 'kubeconfig' key (nor 'token' and 'bundle.crt' from Gardener's token requestor)"
    )
    assert secret.update({"kubeconfig": "!!not base64!!"}) is False
    assert secret.error.startswith("cannot be decoded")
    assert secret.update(secret_data(KUBECONFIG)["data"]) is True
    assert secret().server == "https://127.0.0.1:1" and secret().headers() == {"Authorization": "Bearer t1"}
    assert secret.update(secret_data(KUBECONFIG)["data"]) is False  # unchanged: the same sessions
    rotated = {**KUBECONFIG, "users": [{"name": "u", "user": {"token": "t2"}}]}
    assert secret.update(secret_data(rotated)["data"]) is True
    assert secret().headers() == {"Authorization": "Bearer t2"}
    # A broken or deleted Secret leaves the last good credentials in use, and says why.
    assert secret.update(None) is False and secret.error == "the secret does not exist"
    assert secret().headers() == {"Authorization": "Bearer t2"}


def acting(tmp_path: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Kubeconfigs whose user or cluster acts on the aggregator's pod: the field, and the
    kubeconfig. The exec plugin would leave a file behind; tokenFile would send the pod's
    own token."""
    ran = tmp_path / "ran"
    own_token = tmp_path / "token"
    own_token.write_text("the-pods-own-seed-token")
    exec_user = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "/bin/sh",
        "args": ["-c", f'touch {ran}; echo \'{{"status": {{"token": "x"}}}}\''],
    }

    def with_user(user: dict[str, Any]) -> dict[str, Any]:
        return {**KUBECONFIG, "users": [{"name": "u", "user": user}]}

    def with_cluster(extra: dict[str, Any]) -> dict[str, Any]:
        return {
            **KUBECONFIG,
            "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1", **extra}}],
        }

    return {
        "exec": ("exec", with_user({"exec": exec_user})),
        "tokenFile": ("tokenFile", with_user({"tokenFile": str(own_token)})),
        "client-certificate": ("client-certificate", with_user({"client-certificate": str(own_token)})),
        "auth-provider": ("auth-provider", with_user({"auth-provider": {"name": "oidc"}})),
        "certificate-authority": (
            "certificate-authority",
            with_cluster({"certificate-authority": str(own_token)}),
        ),
        "proxy-url": ("proxy-url", with_cluster({"proxy-url": "http://127.0.0.1:3128"})),
        # Not the current context's user: a Secret carries nothing it could run later.
        "another user": (
            "exec",
            {**KUBECONFIG, "users": [*KUBECONFIG["users"], {"name": "v", "user": {"exec": exec_user}}]},
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "exec",
        "tokenFile",
        "client-certificate",
        "auth-provider",
        "certificate-authority",
        "proxy-url",
        "another user",
    ],
)
def test_a_secret_kubeconfig_carries_data_never_an_action(tmp_path: Path, case: str) -> None:
    """A kubeconfig from a Secret is refused, naming the Secret and the field, for anything
    beyond credentials as data: whoever writes the Secret must not run a command in the
    aggregator nor send its own token elsewhere. Before, the exec plugin ran and tokenFile
    was read."""
    field, kubeconfig = acting(tmp_path)[case]
    secret = SecretKubeconfig("shoot--p--a", "access")
    assert secret.update(secret_data(kubeconfig)["data"]) is False
    with pytest.raises(KubeconfigError) as refused:
        secret()
    assert "secret shoot--p--a/access" in str(refused.value) and repr(field) in str(refused.value), (
        refused.value
    )
    assert not (tmp_path / "ran").exists()


def test_the_aggregators_own_kubeconfig_keeps_the_loaders_features(tmp_path: Path) -> None:
    """Its own kubeconfig is the operator's, not a Secret's: tokenFile (the in-cluster token
    re-read as it rotates) stays."""
    _, kubeconfig = acting(tmp_path)["tokenFile"]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    assert load_kubeconfig(path).headers() == {"Authorization": "Bearer the-pods-own-seed-token"}


async def test_a_token_requestor_secret_without_a_kubeconfig_reaches_the_shoots_service(
    tmp_path: Path,
) -> None:
    """Gardener's token requestor, asked to inject the CA bundle into a Secret without a
    kubeconfig, writes ``token`` and ``bundle.crt``: enough for the shoot's in-seed Service."""
    ca = base64.b64encode(CertificateAuthority(tmp_path).cert_path.read_bytes()).decode()
    secret = SecretKubeconfig("shoot--p--a", "access")
    assert secret.update({"token": base64.b64encode(b"requested").decode()}) is False  # no CA yet
    assert "'bundle.crt'" in secret.error
    data = {"token": base64.b64encode(b"requested").decode(), "bundle.crt": ca}
    assert secret.update(data) is True
    assert secret().server == TOKEN_REQUESTOR_SERVER.format(namespace="shoot--p--a")
    assert secret().server == "https://kube-apiserver.shoot--p--a.svc"
    assert secret().headers() == {"Authorization": "Bearer requested"}
    assert secret.update(data) is False  # unchanged
    renewed = {**data, "token": base64.b64encode(b"renewed").decode()}
    assert secret.update(renewed) is True and secret().headers() == {"Authorization": "Bearer renewed"}
    assert secret.update({**renewed, "bundle.crt": "bm90IGEgY2VydA=="}) is False  # "not a cert"
    assert secret.error and secret().headers() == {"Authorization": "Bearer renewed"}
    assert secret.update(renewed) is False and secret.error == ""  # the good one back


async def test_every_kubeconfig_secret_comes_from_one_watch_selected_by_name() -> None:
    seed = FakeKube()
    for ns in ("shoot--p--a", "shoot--p--b"):
        secret_at(seed, ns, KUBECONFIG)
    seed.put("/api/v1/namespaces/shoot--p--a/secrets/other", secret_data(KUBECONFIG))
    requests: list[tuple[str, str]] = []
    seed.on_request = lambda method, path: requests.append((method, path))
    rotated = {**KUBECONFIG, "users": [{"name": "u", "user": {"token": "t2"}}]}
    event = {"metadata": {"name": "access", "namespace": "shoot--p--b"}, **secret_data(rotated)}
    seed.watches = [[{"type": "MODIFIED", "object": event}]]
    secrets = KubeconfigSecrets(seed, "access")
    b = None
    async with running(secrets):
        a = await secrets.kubeconfig("shoot--p--a")
        b = await secrets.kubeconfig("shoot--p--b")
        assert a().headers() == {"Authorization": "Bearer t1"}
        for _ in range(100):
            if b().headers() != {"Authorization": "Bearer t1"}:
                break
            await asyncio.sleep(0.01)
        c = await secrets.kubeconfig("shoot--p--c")  # a target runs blind on it and says why
        with pytest.raises(KubeconfigError, match="secret shoot--p--c/access: the secret does not exist"):
            c()
    assert b is not None and b().headers() == {"Authorization": "Bearer t2"}  # rotated by the event
    assert [r for r in requests if "secrets" in r[1]] == [("GET", "/api/v1/secrets")]  # no GET per target


class Failing(Polled):
    async def desired(self) -> dict[str, TargetSpec]:
        raise KubeError("the seed said no")


QUICK = Settings(ShootSettings(poll_s=0.02, restart=Backoff(0.01, 0.02)))


async def test_a_target_whose_kubeconfig_cannot_be_read_runs_blind_and_says_why() -> None:
    """Not built, it would hold what it finds held down for good (its namespace still served):
    built on a client whose every request fails, it is blind, and the blind limit applies."""
    metrics = AggregatorMetrics()
    fleet = Fleet(Shared(QUICK, FakeKube(), World().dependents, metrics))
    spec = TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_path="/nonexistent/kubeconfig")
    task = asyncio.create_task(fleet.run(EnvSource(spec)))
    try:
        await asyncio.wait_for(fleet.reconciled.wait(), 2)
        await asyncio.sleep(1.2)  # a tick
        (snap,) = fleet.snapshot()
        assert "/nonexistent/kubeconfig" in snap["error"] and snap["view"] == "not listed yet", snap
        assert metrics.target_errors.get(target="shoot--p--a") == 0  # running, not crash-looping
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert all(t.done() for t in fleet.tasks.values())  # stopping the fleet stops its targets


async def test_a_target_that_crashes_fails_alone_is_retried_and_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def crash(self: object) -> None:
        raise RuntimeError("a bug in one target")

    monkeypatch.setattr("aggregator.target.Target.run", crash)
    metrics = AggregatorMetrics()
    # The error is shown until a life lasts the longest back-off: longer than any crash here.
    settings = Settings(ShootSettings(poll_s=0.02, restart=Backoff(0.01, 0.5)))
    fleet = Fleet(Shared(settings, FakeKube(), World().dependents, metrics))
    spec = TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_path="/nonexistent/kubeconfig")
    task = asyncio.create_task(fleet.run(EnvSource(spec)))
    try:
        await asyncio.wait_for(fleet.reconciled.wait(), 2)
        await asyncio.sleep(0.2)
        assert metrics.target_errors.get(target="shoot--p--a") >= 2  # retried, not given up
        (snap,) = fleet.snapshot()
        assert "RuntimeError: a bug in one target" in snap["error"]
        assert snap["namespace"] == "shoot--p--a"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_restarted_target_shows_why_it_crashed_until_it_has_run_as_long_as_the_longest_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash loop must not look healthy while each new life starts (CI saw the status
    page's error empty between two crashes); a life that lasts is healthy again."""
    lives = 0
    second_life = asyncio.Event()

    async def crash_once(self: object) -> None:
        nonlocal lives
        lives += 1
        if lives == 1:
            raise RuntimeError("a bug in one target")
        second_life.set()
        await asyncio.Event().wait()

    monkeypatch.setattr("aggregator.target.Target.run", crash_once)
    settings = Settings(ShootSettings(poll_s=0.02, restart=Backoff(0.01, 0.3)))
    fleet = Fleet(Shared(settings, FakeKube(), World().dependents, AggregatorMetrics()))
    spec = TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_path="/nonexistent/kubeconfig")
    task = asyncio.create_task(fleet.run(EnvSource(spec)))
    try:
        await asyncio.wait_for(fleet.reconciled.wait(), 2)
        await asyncio.wait_for(second_life.wait(), 2)
        (snap,) = fleet.snapshot()
        assert snap["error"] == "RuntimeError: a bug in one target", snap  # a second life, just started
        await asyncio.sleep(0.4)
        (snap,) = fleet.snapshot()
        assert "RuntimeError" not in snap.get("error", ""), snap
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_failing_source_is_reported_and_the_fleet_still_counts_as_reconciled() -> None:
    fleet = Fleet(Shared(QUICK, FakeKube(), World().dependents, AggregatorMetrics()))
    task = asyncio.create_task(fleet.run(Failing()))
    try:
        await asyncio.wait_for(fleet.reconciled.wait(), 2)
        assert fleet.source_error == "the seed said no" and fleet.snapshot() == []
        assert fleet.unready() == "the targets are unavailable: the seed said no"  # /readyz: 503
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_target_that_fails_while_it_is_stopped_still_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that fails in the moment the fleet stops: Python 3.11's TaskGroup then raises the
    failure and drops the cancellation, and a supervisor that took it for a crash restarted the
    target for ever, so the aggregator never stopped (CI's 120 s timeout)."""

    async def fails_when_cancelled(self: object) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise KubeError("the request in flight failed as it was cancelled") from None

    monkeypatch.setattr("aggregator.target.Target.run", fails_when_cancelled)
    fleet = Fleet(Shared(QUICK, FakeKube(), World().dependents, AggregatorMetrics()))
    spec = TargetSpec("shoot--p--a", "shoot--p--a", kubeconfig_path="/nonexistent/kubeconfig")
    task = asyncio.create_task(fleet.run(EnvSource(spec)))
    await asyncio.wait_for(fleet.reconciled.wait(), 2)
    await asyncio.sleep(0.05)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2)
    assert done, "the fleet did not stop: a target's failure swallowed the cancellation"

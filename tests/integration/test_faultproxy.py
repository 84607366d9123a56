"""The fault-injecting proxy in front of the real seed API server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.errors import ServerError, TooManyRequests
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane, ensure_namespace
from testenv.net.faultproxy import FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(seed_plane: ControlPlane) -> Iterator[FaultProxy]:
    p = FaultProxy(seed_plane).open()
    try:
        yield p
    finally:
        p.shutdown()


@pytest.fixture
def namespace(seed_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    test: str = request.node.name
    name = "faultproxy-" + test.lower().replace("_", "-")[5:40].strip("-")
    with seed_plane.admin_client() as admin:
        ensure_namespace(admin, name)
        admin.ensure(
            f"/api/v1/namespaces/{name}/configmaps", {"metadata": {"name": "cm"}, "data": {"k": "v0"}}
        )
    return name


def through(proxy: FaultProxy, timeout_s: float = 10.0) -> Client:
    cp = proxy.cp
    return Client(
        proxy.url, str(cp.ca_file), cert=(str(cp.admin.cert), str(cp.admin.key)), timeout_s=timeout_s
    )


def cm(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps/cm"


def test_requests_pass_through(proxy: FaultProxy, namespace: str, seed_plane: ControlPlane) -> None:
    with through(proxy) as c:
        assert c.get(cm(namespace))["data"] == {"k": "v0"}
        c.merge_patch(cm(namespace), {"data": {"k": "v1"}})
    with seed_plane.admin_client() as direct:
        assert direct.get(cm(namespace))["data"] == {"k": "v1"}
    assert proxy.requests == 2


def test_a_bearer_token_is_forwarded_not_replaced(
    proxy: FaultProxy, namespace: str, seed_plane: ControlPlane
) -> None:
    with seed_plane.admin_client() as admin:
        admin.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nobody"}})
        token = admin.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/nobody/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
    # The account has no RBAC: were the proxy to swap in its admin certificate, this would be a 200.
    with Client(proxy.url, str(seed_plane.ca_file), token=token) as c:
        response = c.http.get(cm(namespace))
    assert response.status_code == 403, response.text
    assert f"system:serviceaccount:{namespace}:nobody" in response.json()["message"]


def test_a_matching_patch_fails_and_changes_nothing(
    proxy: FaultProxy, namespace: str, seed_plane: ControlPlane
) -> None:
    rule = proxy.fail(500, method="PATCH", path=r"/configmaps/cm$")
    with through(proxy) as c:
        with pytest.raises(ServerError) as e:
            c.merge_patch(cm(namespace), {"data": {"k": "broken"}})
        assert (e.value.status, e.value.reason) == (500, "InternalError")
        assert c.get(cm(namespace))["data"] == {"k": "v0"}  # GET does not match the rule
        with pytest.raises(ServerError):
            c.merge_patch(cm(namespace), {"data": {"k": "broken"}})
    with seed_plane.admin_client() as direct:
        assert direct.get(cm(namespace))["data"] == {"k": "v0"}
    assert rule.hits == 2
    # A request is recorded once the proxy is done with it, which can be after the client is.
    wait_for(lambda: len(proxy.seen) == 3, 5, "the proxy to be done with all three")
    assert [(s.method, s.status, s.injected) for s in proxy.seen] == [
        ("PATCH", 500, True),
        ("GET", 200, False),
        ("PATCH", 500, True),
    ]


def test_count_fails_that_many_then_passes(proxy: FaultProxy, namespace: str) -> None:
    rule = proxy.fail(500, method="patch", path="configmaps", count=1)
    with through(proxy) as c:
        with pytest.raises(ServerError):
            c.merge_patch(cm(namespace), {"data": {"k": "v1"}})
        assert c.merge_patch(cm(namespace), {"data": {"k": "v2"}})["data"] == {"k": "v2"}
    assert (rule.hits, rule.active) == (1, False)


def test_clear_removes_every_rule(proxy: FaultProxy, namespace: str) -> None:
    proxy.fail(500)
    proxy.fail(503, method="GET")
    proxy.clear()
    with through(proxy) as c:
        assert c.get(cm(namespace))["data"] == {"k": "v0"}
    assert proxy.rules == []


def test_429_carries_retry_after(proxy: FaultProxy, namespace: str) -> None:
    proxy.fail(429, method="GET", retry_after=7)
    with through(proxy) as c:
        with pytest.raises(TooManyRequests) as e:
            c.get(cm(namespace))
        assert c.last_headers["Retry-After"] == "7"
    assert e.value.retry_after_s == 7
    assert e.value.reason == "TooManyRequests"


def test_blackhole_holds_requests_until_turned_off(proxy: FaultProxy, namespace: str) -> None:
    proxy.blackhole(True)
    with through(proxy, timeout_s=1.0) as c:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            c.get(cm(namespace))
        assert time.monotonic() - started >= 1.0
        proxy.blackhole(False)
        assert c.get(cm(namespace))["data"] == {"k": "v0"}
    # The request whose client gave up was dropped, not delivered late.
    wait_for(lambda: len(proxy.seen) == 2, 5, "the proxy to be done with both")
    assert [s.status for s in proxy.seen] == [0, 200]


def test_a_watch_streams_and_stalls_in_the_blackhole(
    proxy: FaultProxy, namespace: str, seed_plane: ControlPlane
) -> None:
    events: list[dict[str, Any]] = []
    got = threading.Event()

    def watch() -> None:
        with through(proxy) as c:
            rv = c.get(cm(namespace))["metadata"]["resourceVersion"]
            for event in c.watch(f"/api/v1/namespaces/{namespace}/configmaps", 30, resourceVersion=rv):
                events.append(event)
                got.set()
                if len(events) == 2:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(1)  # the watch is open
    with seed_plane.admin_client() as direct:
        direct.merge_patch(cm(namespace), {"data": {"k": "v1"}})
        # Long before the watch's 30 s end: the event was streamed, not buffered.
        assert got.wait(5), "no event through the proxy"
        proxy.blackhole(True)
        direct.merge_patch(cm(namespace), {"data": {"k": "v2"}})
        time.sleep(1.5)
        assert len(events) == 1, "an event got through the black hole"
        assert proxy.held == 1
        proxy.blackhole(False)
    watcher.join(5)
    assert [e["object"]["data"]["k"] for e in events] == ["v1", "v2"]

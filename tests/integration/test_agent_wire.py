"""The agent's HTTP (agent/wire.py) against the real API server: HTTP/2 as kube-apiserver speaks
it, one connection for many requests, and a request cancelled from outside that leaves the
connection warm (the reason the agent bounds requests by cancelling them)."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from agent.origin import Origin
from agent.path import Attempt, Connection
from agent.wire import H2Wire, Request
from testenv.kube.controlplane import ControlPlane

pytestmark = pytest.mark.integration


def admin_context(cp: ControlPlane) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.load_cert_chain(str(cp.admin.cert), str(cp.admin.key))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def get(path: str) -> Request:
    return Request("GET", path, {"Accept": "application/json"})


async def test_requests_share_one_http2_connection_and_a_cancelled_one_leaves_it_warm(
    control_plane: ControlPlane,
) -> None:
    conn = Connection(Origin.from_url(control_plane.url), admin_context(control_plane))
    try:
        first = Attempt(new=True)
        version = await conn.request(get("/version"), first, connect_timeout_s=5)
        assert version.status_code == 200 and "gitVersion" in version.json()
        assert version.headers["Content-Type"] == "application/json"  # any case, as HTTP's
        assert set(first.phases) == {"dns", "connect", "tls", "request"} and first.reached == ""
        wire = conn._wire
        assert isinstance(wire, H2Wire)

        # A watch answers nothing for 30 s: cancelled from outside after 0.3 s, like a
        # request whose window closed.
        watch = get("/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=30")
        attempt = Attempt(new=False, reached="request")
        task = asyncio.create_task(conn.request(watch, attempt, connect_timeout_s=5))
        await asyncio.sleep(0.3)
        # Meanwhile another request on the same connection (a stream beside it) is answered.
        namespace = get("/api/v1/namespaces/default")
        beside = await conn.request(namespace, Attempt(new=False), connect_timeout_s=5)
        assert beside.status_code == 200 and beside.json()["kind"] == "Namespace"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert attempt.sent and attempt.reached == "request"

        after = Attempt(new=False)
        again = await conn.request(get("/version"), after, connect_timeout_s=5)
        assert again.status_code == 200
        assert conn._wire is wire and wire.usable and conn.answered == 3
        assert not wire.streams  # nothing left of the cancelled stream

        # An API error is an answer like any other: its status and body are the caller's.
        missing = await conn.request(get("/api/v1/namespaces/nope"), Attempt(new=False), connect_timeout_s=5)
        assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"
    finally:
        await conn.aclose()

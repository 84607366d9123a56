"""KubeClient's requests on the wire: every verb carries the same headers (credentials, who
asks, what it accepts), and every transport failure is one TransportError naming the request.
Against a real aiohttp server on loopback."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from aggregator.kube.client import METADATA_ONLY, KubeClient
from aggregator.kube.endpoint import Endpoint
from core.errors import TransportError


@pytest.fixture
async def server() -> AsyncIterator[tuple[KubeClient, list[web.Request]]]:
    seen: list[web.Request] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        if request.query.get("watch") == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(json.dumps({"type": "BOOKMARK", "object": {}}).encode() + b"\n")
            return response
        return web.json_response({"kind": "Status"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    endpoint = Endpoint(f"http://127.0.0.1:{port}", ssl.create_default_context(), lambda: "tok", "t")
    client = KubeClient(lambda: endpoint, user_agent="dwd-lease-aggregator/test")
    try:
        yield client, seen
    finally:
        await client.close()
        await runner.cleanup()


async def test_every_verb_sends_the_credentials_the_user_agent_and_what_it_accepts(
    server: tuple[KubeClient, list[web.Request]],
) -> None:
    client, seen = server
    await client.get("/api/v1/nodes")
    await client.merge_patch("/api/v1/nodes/a", {"metadata": {}})
    await client.request("GET", "/api/v1/nodes/a", accept=METADATA_ONLY)
    async for _event in client.watch("/api/v1/nodes", resource_version="1", timeout_s=1):
        break
    await client.probe(timeout_s=2)
    assert [r.method for r in seen] == ["GET", "PATCH", "GET", "GET", "GET"]
    for r in seen:
        assert r.headers["Authorization"] == "Bearer tok"
        assert r.headers["User-Agent"] == "dwd-lease-aggregator/test", r.path  # the probe's too
    assert [r.headers["Accept"] for r in seen] == [
        "application/json",
        "application/json",
        METADATA_ONLY,
        "application/json",
        "application/json",
    ]
    assert seen[1].headers["Content-Type"] == "application/merge-patch+json"
    assert "Content-Type" not in seen[0].headers


async def test_a_refused_connection_is_one_transport_error_that_names_the_request() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        endpoint = Endpoint(f"http://127.0.0.1:{port}", ssl.create_default_context(), lambda: None, "t")
        client = KubeClient(lambda: endpoint)
        try:
            with pytest.raises(TransportError) as e:
                await client.get("/api/v1/nodes")
            assert e.value.kind == "connect" and str(e.value).startswith("connect: GET /api/v1/nodes: ")
            with pytest.raises(TransportError) as e:
                await client.probe(timeout_s=1)
            assert e.value.kind == "connect" and str(e.value).startswith("connect: probe /readyz: ")
            with pytest.raises(TransportError) as e:
                async for _ in client.watch("/api/v1/nodes", resource_version="1", timeout_s=1):
                    pass
            assert str(e.value).startswith("connect: WATCH /api/v1/nodes: ")
        finally:
            await client.close()

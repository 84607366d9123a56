"""The agent's HTTP/1.1 fallback (agent/wire.py) against a real HTTP/1.1 server (aiohttp, TLS
without HTTP/2) on loopback: what an ingress that does not offer HTTP/2 would answer.
HTTP/2 is tested against the real API server (tests/integration/test_agent_wire.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from agent.origin import Origin, ssl_context
from agent.path import Attempt, Connection
from agent.wire import H1Wire, Request
from core.errors import TransportError
from testenv.base.pki import CertificateAuthority


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Origin, ssl.SSLContext, list[str]]]:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("srv", "srv", ip_addresses=["127.0.0.1"], server=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)
    peers: list[str] = []
    done = asyncio.Event()

    async def lease(request: web.Request) -> web.StreamResponse:
        peers.append(str(request.transport.get_extra_info("peername")) if request.transport else "")
        body = await request.read()
        if request.query.get("chunked"):
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            for part in (b'{"kind": "Lease", ', b'"body": "' + body + b'"}'):
                await response.write(part)
            await response.write_eof()
            return response
        if request.query.get("slow"):
            await done.wait()  # until the test ends
        headers = {"Connection": "close"} if request.query.get("close") else {}
        return web.json_response({"kind": "Lease", "body": body.decode()}, status=201, headers=headers)

    app = web.Application()
    app.router.add_route("*", "/lease", lease)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    yield Origin("127.0.0.1", port), ssl_context(str(ca.cert_path)), peers
    done.set()
    await runner.cleanup()


def patch(query: str = "") -> Request:
    return Request("PATCH", f"/lease{query}", {"Content-Type": "application/merge-patch+json"}, b"x")


async def test_http11_answers_keep_the_connection_and_chunked_bodies_are_whole(
    server: tuple[Origin, ssl.SSLContext, list[str]],
) -> None:
    origin, ctx, peers = server
    conn = Connection(origin, ctx)
    try:
        plain = await conn.request(patch(), Attempt(new=True), connect_timeout_s=5)
        assert isinstance(conn._wire, H1Wire)
        assert plain.status_code == 201 and plain.json() == {"kind": "Lease", "body": "x"}
        chunked = await conn.request(patch("?chunked=1"), Attempt(new=False), connect_timeout_s=5)
        assert chunked.status_code == 200 and chunked.json() == {"kind": "Lease", "body": "x"}
        assert chunked.headers["content-type"] == "application/json"
        assert len(set(peers)) == 1  # both on one kept-alive connection

        # The server ends the connection after its answer: the answer counts, the next
        # request fails at once (the caller opens a new connection).
        closing = await conn.request(patch("?close=1"), Attempt(new=False), connect_timeout_s=5)
        assert closing.status_code == 201
        with pytest.raises(TransportError) as e:
            await conn.request(patch(), Attempt(new=False), connect_timeout_s=5)
        assert e.value.kind == "connect"
    finally:
        await conn.aclose()


async def test_a_cancelled_http11_request_ends_its_connection(
    server: tuple[Origin, ssl.SSLContext, list[str]],
) -> None:
    """HTTP/1.1 cannot abandon a request and go on: the answer would come on the next one."""
    origin, ctx, _ = server
    conn = Connection(origin, ctx)
    try:
        await conn.request(patch(), Attempt(new=True), connect_timeout_s=5)
        attempt = Attempt(new=False, reached="request")
        task = asyncio.create_task(conn.request(patch("?slow=1"), attempt, connect_timeout_s=5))
        await asyncio.sleep(0.3)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert attempt.sent
        with pytest.raises(TransportError) as e:
            await conn.request(patch(), Attempt(new=False), connect_timeout_s=5)
        assert "closed" in str(e.value)
    finally:
        await conn.aclose()


async def test_an_http11_body_without_a_length_is_read_to_the_end(tmp_path: Path) -> None:
    """No Content-Length and no chunks: the body is what comes until the server closes, sent
    here in two parts with a pause between (one read would see only the first)."""
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("srv", "srv", ip_addresses=["127.0.0.1"], server=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"kind": ')
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b'"Lease"}')
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=ctx)
    conn = Connection(Origin("127.0.0.1", server.sockets[0].getsockname()[1]), ssl_context(str(ca.cert_path)))
    try:
        response = await conn.request(Request("GET", "/lease", {}), Attempt(new=True), connect_timeout_s=5)
        assert response.json() == {"kind": "Lease"}
    finally:
        await conn.aclose()
        server.close()
        await server.wait_closed()

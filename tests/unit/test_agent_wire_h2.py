"""HTTP/2 edge cases of the agent's wire (agent/wire.py) that the real API server does not
produce on demand: a GOAWAY under a waiting request, header values that are not UTF-8, a
connection reset in the TLS handshake. The server is h2's own state machine on loopback
TLS; the ordinary exchange is tested against kube-apiserver (tests/integration/test_agent_wire.py)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from agent.origin import Origin, ssl_context
from agent.path import Attempt, Connection
from agent.wire import Request
from core.errors import TransportError
from testenv.base.pki import CertificateAuthority

Handler = Callable[[h2.connection.H2Connection, h2.events.RequestReceived], None]


class H2Server:
    """Answers each request with ``handler``; h2's server side, on loopback TLS."""

    def __init__(self, tmp: Path, handler: Handler) -> None:
        self.ca = CertificateAuthority(tmp)
        self.pair = self.ca.issue("srv", "srv", ip_addresses=["127.0.0.1"], server=True)
        self.handler = handler
        self.writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    self.handler(conn, event)
            writer.write(conn.data_to_send())

    async def start(self) -> Origin:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.pair.cert, self.pair.key)
        ctx.set_alpn_protocols(["h2"])
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        return Origin("127.0.0.1", self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[Handler], Any]]:
    servers: list[H2Server] = []

    async def start(handler: Handler) -> tuple[Origin, ssl.SSLContext]:
        (tmp_path / str(len(servers))).mkdir()
        server = H2Server(tmp_path / str(len(servers)), handler)
        servers.append(server)
        return await server.start(), ssl_context(str(server.ca.cert_path))

    yield start
    for s in servers:
        await s.stop()


def get(path: str = "/") -> Request:
    return Request("GET", path, {})


async def test_a_goaway_fails_the_request_waiting_on_it_at_once(serve: Callable[[Handler], Any]) -> None:
    """KAPI going away (a rollout, --goaway-chance) under a renewal: the renewal fails now,
    not when its window closes, so the policy asks again on a new connection in time."""

    def go_away(conn: h2.connection.H2Connection, event: h2.events.RequestReceived) -> None:
        if event.headers and (b":path", b"/bye") in event.headers:
            conn.close_connection(last_stream_id=event.stream_id)
        else:
            conn.send_headers(event.stream_id, [(":status", "200")], end_stream=True)

    origin, ctx = await serve(go_away)
    conn = Connection(origin, ctx)
    try:
        assert (await conn.request(get(), Attempt(new=True), connect_timeout_s=5)).status_code == 200
        with pytest.raises(TransportError) as e:
            await asyncio.wait_for(conn.request(get("/bye"), Attempt(new=False), connect_timeout_s=5), 2)
        assert e.value.kind == "connect" and "went away" in str(e.value)
        with pytest.raises(TransportError, match="closed"):
            await conn.request(get(), Attempt(new=False), connect_timeout_s=5)
    finally:
        await conn.aclose()


async def test_headers_not_utf8_or_repeated_are_read_as_http_has_it(
    serve: Callable[[Handler], Any],
) -> None:
    def answer(conn: h2.connection.H2Connection, event: h2.events.RequestReceived) -> None:
        headers = [(b":status", b"200"), (b"warning", b'299 - "a"'), (b"warning", b'299 - "b"')]
        conn.send_headers(event.stream_id, [*headers, (b"x-note", b"caf\xe9")])
        conn.send_data(event.stream_id, b"{}", end_stream=True)

    origin, ctx = await serve(answer)
    conn = Connection(origin, ctx)
    try:
        response = await conn.request(get(), Attempt(new=True), connect_timeout_s=5)
        assert response.headers["X-Note"] == "caf\xe9"  # latin-1, what HTTP allows
        assert response.headers["warning"] == '299 - "a", 299 - "b"'
        assert (await conn.request(get(), Attempt(new=False), connect_timeout_s=5)).json() == {}
    finally:
        await conn.aclose()


async def test_a_connection_reset_in_the_tls_handshake_is_a_tls_failure() -> None:
    """An ingress that takes the connection and resets it at the ClientHello: the tls step
    failed (the agent then re-reads its CA), not the connect."""

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(10)
        writer.transport.abort()

    server = await asyncio.start_server(reset, "127.0.0.1", 0)
    conn = Connection(Origin("127.0.0.1", server.sockets[0].getsockname()[1]), ssl_context(""))
    attempt = Attempt(new=True)
    try:
        with pytest.raises(TransportError) as e:
            await conn.request(get(), attempt, connect_timeout_s=5)
        assert e.value.kind == "tls" and attempt.reached == "tls"
    finally:
        await conn.aclose()
        server.close()
        await server.wait_closed()

"""A server that means harm, or is badly broken, meets the agent's wire (agent/wire.py): one that
streams HTTP/1.1 header lines without end, sends headers h11 refuses, floods HTTP/2 control
frames while reading none of the answers; and random bytes where a response should be. Each
ends in a failed request with a reason, within its window, the agent's memory bounded: one
misbehaving endpoint must not grow the agent on every node."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import h2.config
import h2.connection
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import path, wire
from agent.origin import Origin, ssl_context
from agent.path import Attempt, Connection
from agent.wire import H1Wire, H2Wire, Request, Response, Wire, WireError
from core.errors import TransportError
from testenv.base.pki import CertificateAuthority

SMALL_SEND_BUFFER = (socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
# How long a request may take before a test gives up on it: a guard, not a bound a test asserts.
# The servers below spend seconds of CPU sending header lines and pings by the ten thousand,
# 14 s beside other tests under pytest -n 4 on a busy 2-core machine.
GUARD_S = 60.0
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Serve = Callable[[Answer, bool], Awaitable[tuple[Origin, ssl.SSLContext]]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    """``serve(answer, h2)``: a loopback TLS server running ``answer`` on each connection,
    offering HTTP/2 by ALPN or not (then the agent speaks HTTP/1.1)."""
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("srv", "srv", ip_addresses=["127.0.0.1"], server=True)
    servers: list[asyncio.Server] = []
    writers: list[asyncio.StreamWriter] = []

    async def start(answer: Answer, offer_h2: bool) -> tuple[Origin, ssl.SSLContext]:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(pair.cert, pair.key)
        if offer_h2:
            ctx.set_alpn_protocols(["h2"])

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            with contextlib.suppress(ConnectionError, ssl.SSLError):  # the agent gave up: as wanted
                await answer(reader, writer)

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        servers.append(server)
        return Origin("127.0.0.1", server.sockets[0].getsockname()[1]), ssl_context(str(ca.cert_path))

    yield start
    for w in writers:
        w.close()
    for s in servers:
        s.close()
        await s.wait_closed()


def get() -> Request:
    return Request("GET", "/lease", {})


async def _refused(origin: Origin, ctx: ssl.SSLContext, within_s: float) -> tuple[str, float, int]:
    """The request's failure, how long it took and the peak of memory traced meanwhile."""
    conn = Connection(origin, ctx)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(TransportError) as failed:
            await asyncio.wait_for(conn.request(get(), Attempt(new=True), connect_timeout_s=5), within_s)
        _, peak = tracemalloc.get_traced_memory()
        return str(failed.value), time.monotonic() - started, peak
    finally:
        tracemalloc.stop()
        await conn.aclose()


async def test_a_server_streaming_header_lines_fails_the_request_at_16_kib(serve: Serve) -> None:
    """Before h11 each header line was capped, their number and total not: such a server grew
    the agent from 21 to 399 MiB in the default 4 s window. What the server got to send before
    the agent hung up is bounded in bytes, not in time: the kernel's loopback buffers take
    about 4 MiB of it, at the pace the machine allows (up to 6.5 s on a loaded one)."""
    sent: list[int] = []

    async def endless_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(1_000_000):
            line = b"X-Header-%d: %s\r\n" % (i, b"a" * 100)
            writer.write(line)
            sent.append(len(line))
            await writer.drain()

    why, _, peak = await _refused(*await serve(endless_headers, False), within_s=GUARD_S)
    assert "not an HTTP/1.1 response" in why
    assert sum(sent) < 16 << 20 and peak < 2 << 20, (sum(sent), peak)


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n", "not an HTTP/1.1 response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "not an HTTP/1.1 response"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP/1.1 response"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP/1.1 response"),
    ],
    ids=["space-in-name", "two-lengths", "bad-status", "not-http"],
)
async def test_what_h11_refuses_fails_the_request_with_its_reason(
    serve: Serve, head: bytes, reason: str
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)
        await writer.drain()
        writer.close()

    why, _, _ = await _refused(*await serve(answer, False), within_s=4)
    assert reason in why


async def test_repeated_http11_headers_are_joined_as_http_has_it(serve: Serve) -> None:
    """Before, the last of two Warning headers overwrote the first."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b'HTTP/1.1 200 OK\r\nWarning: 299 - "a"\r\nWarning: 299 - "b"\r\nContent-Length: 2\r\n\r\n{}'
        )
        await writer.drain()
        await reader.read()

    conn = Connection(*await serve(answer, False))
    try:
        response = await conn.request(get(), Attempt(new=True), connect_timeout_s=5)
        assert response.headers["warning"] == '299 - "a", 299 - "b"' and response.json() == {}
    finally:
        await conn.aclose()


def _flooding(frames: Callable[[h2.connection.H2Connection], None]) -> Answer:
    """An HTTP/2 server that takes the agent's preface, then sends what ``frames`` queues, again
    and again, and reads nothing more."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        conn.receive_data(await reader.read(65536))
        writer.write(conn.data_to_send())
        for _ in range(100_000):
            frames(conn)
            writer.write(conn.data_to_send())
            await writer.drain()
            await asyncio.sleep(0)  # the agent shares this loop: a real server would not wait on it

    return answer


async def test_an_http2_server_flooding_pings_fails_the_connection_at_once(serve: Serve) -> None:
    """Before, every PING's ACK was queued without a drain: the agent grew 2.4 MiB/s and its
    loop stalled up to 0.77 s."""
    why, took, peak = await _refused(*await serve(_flooding(lambda c: c.ping(b"12345678")), True), within_s=4)
    assert f"over {wire.MAX_CONTROL_FRAMES_PER_S} control frames in a second" in why
    assert took < 1 and peak < 2 << 20, (took, peak)


async def test_an_http2_server_that_reads_none_of_its_answers_fails_the_connection(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the rate of control frames unbounded, the answers the server never reads are
    bounded on their own. The kernel's buffers made small (on loopback they hold megabytes),
    so that what the server leaves unread reaches the agent's own buffer within the test."""
    monkeypatch.setattr(wire, "MAX_CONTROL_FRAMES_PER_S", 10**9)
    monkeypatch.setattr(path, "SOCKET_OPTIONS", [*path.SOCKET_OPTIONS, SMALL_SEND_BUFFER])

    def pings(conn: h2.connection.H2Connection) -> None:
        for _ in range(1000):
            conn.ping(b"12345678")

    why, _, peak = await _refused(*await serve(_flooding(pings), True), within_s=GUARD_S)
    assert "the server reads none of its answers" in why
    assert peak < 8 << 20, peak


class _Sink:
    """A writer that takes everything and whose transport has sent it all."""

    def __init__(self) -> None:
        self.transport = self
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


async def _answer_of(
    make: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Wire], data: bytes
) -> Response | WireError:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    # A stand-in with what the wires use of a writer (write, drain, close, the transport's buffer).
    w = make(reader, cast(asyncio.StreamWriter, _Sink()))
    try:
        return await asyncio.wait_for(w.send(get(), "srv", lambda: None), 2)
    except WireError as e:
        return e
    finally:
        w.close()


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HEADS = st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"])


@FUZZ
@given(head=HEADS, rest=st.binary(max_size=2048))
def test_random_bytes_after_an_http11_request_are_a_response_or_a_wire_error(
    head: bytes, rest: bytes
) -> None:
    outcome = asyncio.run(_answer_of(H1Wire, head + rest))
    assert isinstance(outcome, Response | WireError)


def _server_preface() -> bytes:
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    return server.data_to_send()


@FUZZ
@given(rest=st.binary(max_size=2048))
def test_random_bytes_after_an_http2_preface_are_a_response_or_a_wire_error(rest: bytes) -> None:
    async def run() -> Response | WireError:
        return await _answer_of(H2Wire, _server_preface() + rest)

    outcome = asyncio.run(run())
    assert isinstance(outcome, Response | WireError)

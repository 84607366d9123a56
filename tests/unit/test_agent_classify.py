"""Failure classes from real failures on loopback (no traffic leaves the machine)."""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.client import LeaseClient
from agent.origin import Origin, ssl_context
from agent.path import Attempt, Connection, classify
from agent.wire import Request, WireError
from core.credentials import TokenFile
from core.errors import TransportError


@pytest.fixture
def token(tmp_path: Path) -> TokenFile:
    p = tmp_path / "token"
    p.write_text("t")
    return TokenFile(p)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """Accepts TCP connections and never answers: a black hole behind a working connect."""
    conns: list[asyncio.StreamWriter] = []

    async def hold(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(w)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for w in conns:
        w.close()
    server.close()
    await server.wait_closed()


async def _fail(url: str, token: TokenFile, ca: str = "") -> TransportError:
    client = LeaseClient(url, "ns", "n1", token, lambda: ssl_context(ca))
    try:
        with pytest.raises(TransportError) as e:
            await client.patch({}, window_s=0.5)
    finally:
        await client.aclose()
    return e.value


async def test_closed_port_is_connect(token: TokenFile) -> None:
    assert (await _fail(f"https://127.0.0.1:{closed_port()}", token)).kind == "connect"


async def test_silent_server_is_timeout(token: TokenFile, silent_server: int) -> None:
    assert (await _fail(f"https://127.0.0.1:{silent_server}", token)).kind == "timeout"


async def test_untrusted_certificate_is_tls(token: TokenFile, tmp_path: Path) -> None:
    from testenv.base.pki import CertificateAuthority

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    server_ca, other_ca = CertificateAuthority(tmp_path / "a"), CertificateAuthority(tmp_path / "b")
    pair = server_ca.issue("srv", "srv", ip_addresses=["127.0.0.1"], server=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pair.cert, pair.key)
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=ctx)
    try:
        port = server.sockets[0].getsockname()[1]
        assert (await _fail(f"https://127.0.0.1:{port}", token, str(other_ca.cert_path))).kind == "tls"
    finally:
        server.close()


async def test_unresolvable_name_is_dns(token: TokenFile, monkeypatch: pytest.MonkeyPatch) -> None:
    # The resolver is replaced: a real lookup would leave loopback. The e2e tests stop a real DNS server.
    def no_such_host(*_a: object, **_k: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    assert (await _fail("https://api.shoot.invalid", token)).kind == "dns"


def test_classify_walks_the_cause_chain() -> None:
    try:
        try:
            raise ssl.SSLCertVerificationError("bad cert")
        except ssl.SSLError as inner:
            raise WireError("wrapped") from inner
    except WireError as e:
        assert classify(e) == "tls"
    assert classify(TimeoutError()) == "timeout"
    assert classify(WireError("the server closed the connection")) == "connect"


async def test_a_handshake_cancelled_from_outside_closes_its_socket(silent_server: int) -> None:
    """A sibling that loses its race is cancelled in the middle of its TLS handshake: its socket
    must be closed then, not left to the garbage collector (a file descriptor held until a
    collection, and a ResourceWarning)."""
    # What earlier tests left to the collector is collected first: its warnings are not this one's.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    conn = Connection(Origin("127.0.0.1", silent_server), ssl_context(""))
    task = asyncio.create_task(conn.request(Request("GET", "/", {}), Attempt(new=True), connect_timeout_s=30))
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await conn.aclose()
    del task
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []


async def test_a_new_connection_loads_no_ca_bundle_but_the_agents_own(
    monkeypatch: pytest.MonkeyPatch, token: TokenFile
) -> None:
    """Each new connection used to build an httpx transport with its default context, loading
    certifi's bundle (60 ms of CPU) only to throw it away: a fresh agent on a loaded node, and
    one retrying a refused KAPI, spent most of its CPU there."""
    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        real(self, *args, **kwargs)  # type: ignore[arg-type]  # passed on as they came

    ctx = ssl_context("")  # the agent's context, built once
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    client = LeaseClient(f"https://127.0.0.1:{closed_port()}", "ns", "n1", token, lambda: ctx)
    try:
        for _ in range(3):
            with pytest.raises(TransportError):
                await client.patch({}, window_s=0.5)
    finally:
        await client.aclose()
    assert client.connections_opened >= 3
    assert loads == []

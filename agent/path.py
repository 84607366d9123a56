"""One connection to KAPI through its external name, timed step by step.

The agent resolves the name itself and connects to the address it got, with
the name as TLS server name and Host header, so each step of a new connection
(DNS, TCP connect, TLS, the request) has its own time: an operator can then
tell a slow path from a broken one, and which step is which. Every httpx and
resolver exception is translated into core.errors here.

The caller bounds each request from outside by cancelling it: a read timeout
of httpx's would poison an HTTP/2 connection for good, while a cancelled
request leaves it usable, so a connection that was merely slow stays warm.
Only the handshake has httpx's own timeout, set just inside the caller's: a
handshake cancelled from outside leaves its socket to the garbage collector,
one that times out closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore
import httpx

from core.errors import TransportError, TransportKind

PHASES = ("dns", "connect", "tls", "request")

# httpcore's trace events that end each phase (prefix http11. or http2.).
_TRACE_PHASES = {
    "connection.connect_tcp": "connect",
    "connection.start_tls": "tls",
}


# Linear retransmission timeouts for a connection with few packets in flight, which a
# renewal's always is: TCP's exponential backoff after a lost packet (0.2, 0.4, 0.8, 1.6 s)
# would stall a kept connection for longer than a window on a lossy path; the first six
# retransmissions then come every RTO instead. Linux only (include/uapi/linux/tcp.h).
TCP_THIN_LINEAR_TIMEOUTS = 16
SOCKET_OPTIONS = [(socket.IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, 1)] if sys.platform == "linux" else []


def classify(exc: BaseException) -> TransportKind:
    """Which step of the path failed, from the exception and everything it was raised from."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    if any(isinstance(e, socket.gaierror) for e in seen):
        return "dns"
    # A handshake that times out carries SSL errors in its context: time first.
    if any(isinstance(e, httpx.TimeoutException | TimeoutError) for e in seen):
        return "timeout"
    if any(isinstance(e, ssl.SSLError | ssl.CertificateError) for e in seen):
        return "tls"
    return "connect"


def ssl_context(ca_file: str = "", *, ca_pem: str = "") -> ssl.SSLContext:
    """Verify against the CA file or PEM, or the system store when neither is given."""
    ctx = ssl.create_default_context(cafile=ca_file or None, cadata=ca_pem or None)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


class _ClosingStream(httpcore.AsyncNetworkStream):
    """httpcore closes a stream whose TLS handshake fails, not one whose handshake is cancelled:
    that socket would wait for the garbage collector. A race cancels the handshakes that lost."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    # The timeout parameters are httpcore's interface, passed on as they come.
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> httpcore.AsyncNetworkStream:
        try:
            return await self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._inner.aclose()
            raise

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _ClosingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _ClosingStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


@dataclass
class Attempt:
    """What one request on one connection saw: the time of each step it finished, the step
    it was in when it ended, and whether the whole request was written (then the server
    may have applied it even if no answer came back)."""

    new: bool
    phases: dict[str, float] = field(default_factory=dict)
    reached: str = "dns"
    sent: bool = False

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: round(v, 3) for k, v in self.phases.items()}
        out["connection"] = "new" if self.new else "warm"
        if self.reached:
            out["stuck"] = self.reached
        return out


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    content: bytes | None = None


@dataclass(frozen=True)
class Origin:
    """The external name as the agent dials it: host for DNS, TLS and the Host header."""

    host: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"{url!r} has no host")
        return cls(parts.hostname, parts.port or 443)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 443 else f"{host}:{self.port}"


async def resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` in the resolver's order, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


class Connection:
    """One kept-alive connection (HTTP/2 where offered) to one address of the external name.

    It is opened by its first request, which looks the name up; ``answered`` counts the
    HTTP answers it got, so a connection with none is still unproven.
    """

    def __init__(
        self,
        origin: Origin,
        ssl_ctx: ssl.SSLContext,
        *,
        clock: Callable[[], float] = time.monotonic,
        resolver: Callable[[str, int], Any] = resolve,
    ) -> None:
        self.origin = origin
        self.ssl = ssl_ctx
        self.clock = clock
        self.resolver = resolver
        self.born = clock()
        self.answered = 0
        self.address = ""
        self._client: httpx.AsyncClient | None = None

    def _client_for(self, address: str) -> httpx.AsyncClient:
        # The point is the external path: no proxy, no netrc, no SSL_CERT_FILE from the environment.
        # ``verify`` is our context: httpx's default loads certifi's bundle for every transport
        # (60 ms of CPU per new connection, only to be replaced below).
        transport = httpx.AsyncHTTPTransport(trust_env=False, verify=self.ssl)
        # httpx takes no network backend: its pool is replaced by one that closes a cancelled
        # handshake's socket (tests/unit/test_agent_classify.py fails if this stops working).
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=self.ssl,
            max_connections=1,
            max_keepalive_connections=1,
            keepalive_expiry=None,
            http1=True,
            http2=True,
            socket_options=SOCKET_OPTIONS,
            network_backend=_ClosingBackend(),
        )
        return httpx.AsyncClient(
            base_url=f"https://{_url_host(address)}:{self.origin.port}",
            transport=transport,
            trust_env=False,
            # Bounded from outside: see the module docstring.
            timeout=httpx.Timeout(None),
            headers={"Accept": "application/json", "User-Agent": "dwd-lease-agent"},
        )

    async def request(self, req: Request, attempt: Attempt, *, connect_timeout_s: float) -> httpx.Response:
        """One request; raises TransportError (with its step) when no HTTP answer came."""
        try:
            if self._client is not None:
                return await self._send(self._client, req, attempt, connect_timeout_s)
            started = self.clock()
            addresses = await self.resolver(self.origin.host, self.origin.port)
            attempt.phases["dns"] = self.clock() - started
            attempt.reached = "connect"
            if not addresses:
                raise socket.gaierror(socket.EAI_NONAME, f"{self.origin.host}: no address")
            # The first address that takes the connection: a refused one (an IPv6 loopback
            # nobody listens on) costs a round trip, not the attempt.
            for i, address in enumerate(addresses):
                client = self._client_for(address)
                try:
                    response = await self._send(client, req, attempt, connect_timeout_s)
                except httpx.ConnectError:
                    await _close(client)
                    if attempt.reached != "connect" or i == len(addresses) - 1:
                        raise
                    continue
                except BaseException:
                    await _close(client)
                    raise
                self._client, self.address = client, address
                return response
            raise AssertionError("unreachable: the last address raises or returns")
        except (httpx.TransportError, OSError, ssl.SSLError) as e:
            message = str(e) or type(e).__name__
            raise TransportError(classify(e), message, sent=attempt.sent, path=(attempt.summary(),)) from e

    async def _send(
        self, client: httpx.AsyncClient, req: Request, attempt: Attempt, connect_timeout_s: float
    ) -> httpx.Response:
        marks: dict[str, float] = {}

        async def trace(event: str, info: Mapping[str, Any]) -> None:
            now = self.clock()
            name, _, edge = event.rpartition(".")
            phase = _TRACE_PHASES.get(name)
            if phase is not None:
                if edge == "started":
                    marks[phase] = now
                    attempt.reached = phase
                elif edge == "complete" and phase in marks:
                    attempt.phases[phase] = now - marks[phase]
            elif name.endswith(".send_request_headers") and edge == "started":
                marks["request"] = now
                attempt.reached = "request"
            elif name.endswith(".send_request_body") and edge == "complete":
                attempt.sent = True
            elif name.endswith(".receive_response_headers") and edge == "complete" and "request" in marks:
                attempt.phases["request"] = now - marks["request"]
                attempt.reached = ""

        response = await client.request(
            req.method,
            req.path,
            content=req.content,
            headers={"Host": self.origin.host_header, **req.headers},
            timeout=httpx.Timeout(None, connect=max(connect_timeout_s, 0.001)),
            extensions={"sni_hostname": self.origin.host, "trace": trace},
        )
        self.answered += 1
        return response

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close(client)


async def _close(client: httpx.AsyncClient) -> None:
    # A broken connection may fail to close; it is dropped either way.
    with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
        await client.aclose()

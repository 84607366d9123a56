"""One connection to KAPI through its external name, timed step by step.

The agent resolves the name itself and connects to the address it got, with
the name as TLS server name and Host header, so each step of a new connection
(DNS, TCP connect, TLS, the request) has its own time: an operator can then
tell a slow path from a broken one, and which step is which. Every failure is
translated into core.errors here.

The caller bounds each request from outside by cancelling it: a cancelled
HTTP/2 request resets only its stream, so a connection that was merely slow
stays warm. A handshake has its own bound, set just inside the caller's; a
connection that fails or is cancelled at any step closes its socket at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.origin import Origin, wire_name
from agent.wire import Request, Response, Wire, open_wire
from core.errors import TransportError, TransportKind

PHASES = ("dns", "connect", "tls", "request")
# On every request: the agent's answers are JSON, and KAPI's audit log names who asked.
HEADERS = {"Accept": "application/json", "User-Agent": "dwd-lease-agent"}


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
    if any(isinstance(e, TimeoutError) for e in seen):
        return "timeout"
    if any(isinstance(e, ssl.SSLError | ssl.CertificateError) for e in seen):
        return "tls"
    return "connect"


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


async def resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` in the resolver's order, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(wire_name(host), port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


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
        self._wire: Wire | None = None

    async def request(self, req: Request, attempt: Attempt, *, connect_timeout_s: float) -> Response:
        """One request; raises TransportError (with its step) when no HTTP answer came."""
        try:
            if self._wire is not None:
                return await self._send(self._wire, req, attempt)
            wire = await self._open(attempt, connect_timeout_s)
            try:
                response = await self._send(wire, req, attempt)
            except BaseException:
                wire.close()  # a connection is kept only once it has answered
                raise
            self._wire = wire
            return response
        except OSError as e:  # ssl.SSLError, TimeoutError and the wire's errors are OSErrors
            message = str(e) or type(e).__name__
            raise TransportError(classify(e), message, sent=attempt.sent, path=(attempt.summary(),)) from e

    async def _open(self, attempt: Attempt, timeout_s: float) -> Wire:
        started = self.clock()
        addresses = await self.resolver(self.origin.host, self.origin.port)
        attempt.phases["dns"] = self.clock() - started
        attempt.reached = "connect"
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, f"{self.origin.host}: no address")
        async with asyncio.timeout(max(timeout_s, 0.001)):
            # The first address that takes the connection: a refused one (an IPv6 loopback
            # nobody listens on) costs a round trip, not the attempt.
            for i, address in enumerate(addresses):
                try:
                    wire = await self._connect(address, attempt)
                except OSError:
                    if attempt.reached != "connect" or i == len(addresses) - 1:
                        raise
                    continue
                self.address = address
                return wire
        raise AssertionError("unreachable: the last address raises or returns")

    async def _connect(self, address: str, attempt: Attempt) -> Wire:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        writer: asyncio.StreamWriter | None = None
        try:
            sock.setblocking(False)
            for option in SOCKET_OPTIONS:
                sock.setsockopt(*option)
            started = self.clock()
            await loop.sock_connect(sock, (address, self.origin.port))
            attempt.phases["connect"] = self.clock() - started
            attempt.reached = "tls"
            started = self.clock()
            try:
                reader, writer = await asyncio.open_connection(
                    sock=sock, ssl=self.ssl, server_hostname=self.origin.server_name
                )
            except (ConnectionError, EOFError) as e:
                # Reset or closed in the handshake: an ingress or load balancer refusing TLS,
                # a failure of the tls step (the CA is re-read after one), as httpx (the agent's
                # client before agent/wire.py) reported it.
                raise ssl.SSLError(f"the connection ended in the TLS handshake: {e}") from e
            attempt.phases["tls"] = self.clock() - started
            attempt.reached = "request"
            return open_wire(reader, writer)
        except BaseException:
            # Failed, timed out or cancelled (a sibling that lost its race): closed now, not
            # left to the garbage collector.
            if writer is not None:
                writer.close()
            sock.close()
            raise

    async def _send(self, wire: Wire, req: Request, attempt: Attempt) -> Response:
        attempt.reached = "request"
        started = self.clock()

        def sent() -> None:
            attempt.sent = True

        full = Request(req.method, req.path, {**HEADERS, **req.headers}, req.content)
        response = await wire.send(full, self.origin.host_header, sent)
        attempt.phases["request"] = self.clock() - started
        attempt.reached = ""
        self.answered += 1
        return response

    async def aclose(self) -> None:
        wire, self._wire = self._wire, None
        if wire is not None:
            # A broken connection may fail to close; it is dropped either way.
            with contextlib.suppress(OSError, RuntimeError):
                wire.close()

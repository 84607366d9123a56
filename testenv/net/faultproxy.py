"""An HTTPS reverse proxy in front of a control plane's kube-apiserver that fails chosen requests.

TcpProxy is a load balancer that can only be cut; this one terminates TLS, so a
test can make a healthy API server answer one PATCH with a 500, throttle with a
429 and Retry-After, or hold every request (a black hole) while the server
itself keeps running for everyone else. Runs in a background thread on its own
event loop, like TcpProxy, so synchronous tests drive it directly.

Identity: the proxy cannot present a client's certificate onward. A request
that carries an Authorization header is forwarded with that header and no
client certificate, so the token's own RBAC applies; every other request is
forwarded with the control plane's admin client certificate (system:masters).

Injected failures never reach the server. Rules are checked in the order they
were added; the first active match answers. Upgrade requests (exec, port-forward)
are not supported.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from testenv.kube.controlplane import ControlPlane, kubeconfig_yaml

T = TypeVar("T")

# metav1.StatusReason for the codes a test is likely to inject; clients branch on it.
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

# Per connection, not per message (RFC 9110 7.6.1); Content-Length is set again by aiohttp.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass
class Rule:
    """One injected failure; ``hits`` counts the requests it answered."""

    status: int
    method: str | None = None
    path: re.Pattern[str] | None = None
    count: int | None = None
    retry_after: int | None = None
    hits: int = 0

    @property
    def active(self) -> bool:
        return self.count is None or self.hits < self.count

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method != method.upper():
            return False
        return self.path is None or self.path.search(path) is not None


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    # The status the client got: injected or the server's; 0 when it never got one.
    status: int
    injected: bool
    t: float  # time.monotonic() when the proxy was done with it


class FaultProxy:
    def __init__(self, cp: ControlPlane, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        if cp.ca is None or not cp.url:
            raise RuntimeError("FaultProxy needs a started ControlPlane")
        self.cp = cp
        self.listen = listen
        self.requests = 0  # every request that reached the proxy
        self.held = 0  # requests and streams waiting in the black hole right now
        self.seen: collections.deque[Seen] = collections.deque(maxlen=2000)
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        stem = f"fault-proxy-{uuid.uuid4().hex[:8]}"
        self._serving = cp.ca.issue(stem, "fault-proxy", ip_addresses=[listen[0]], server=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy", daemon=True)
        self._thread.start()
        self._runner: web.ServerRunner | None = None
        self._admin: aiohttp.ClientSession | None = None
        self._bearer: aiohttp.ClientSession | None = None
        self._passable = asyncio.Event()
        self._passable.set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._closed = False

    @property
    def port(self) -> int:
        return self.listen[1]

    @property
    def url(self) -> str:
        return f"https://{self.listen[0]}:{self.port}"

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- life cycle

    def open(self) -> FaultProxy:
        self._call(self._open())
        return self

    async def _open(self) -> None:
        upstream_ca = str(self.cp.ca_file)
        admin_tls = ssl.create_default_context(cafile=upstream_ca)
        admin_tls.load_cert_chain(str(self.cp.admin.cert), str(self.cp.admin.key))
        bearer_tls = ssl.create_default_context(cafile=upstream_ca)
        # auto_decompress off: bodies pass through byte for byte, Content-Encoding and all.
        self._admin = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=admin_tls), auto_decompress=False, trust_env=False
        )
        self._bearer = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=bearer_tls), auto_decompress=False, trust_env=False
        )
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(self._serving.cert), str(self._serving.key))
        # Cancelling a handler whose client went away is what ends a held request: a
        # request the client gave up on must never reach the server later.
        server = web.Server(self._handle, handler_cancellation=True)
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.listen[0], self.listen[1], ssl_context=serving)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.listen = (host, port)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(TimeoutError, RuntimeError):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _shutdown(self) -> None:
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            # Before the sessions close: a connection handed back to a closed connector is
            # dropped without being closed.
            await asyncio.wait(handlers, timeout=5)
        if self._runner is not None:
            await self._runner.cleanup()
        for session in (self._admin, self._bearer):
            if session is not None and session.connector is not None:
                # Abort, not close: a TLS close waits for the server's close_notify, and a
                # transport still closing when the loop stops is left unclosed.
                await session.connector.close(abort_ssl=True)
                await session.close()
        await asyncio.sleep(0)  # the aborted transports' connection_lost callbacks

    def kubeconfig(self, path: Path | str) -> Path:
        """A kubeconfig for the proxy (the control plane's CA and admin client certificate)."""
        path = Path(path)
        path.write_text(
            kubeconfig_yaml(
                self.url,
                self.cp.ca_file,
                user={"client-certificate": str(self.cp.admin.cert), "client-key": str(self.cp.admin.key)},
            )
        )
        return path

    # -- faults

    def fail(
        self,
        status: int,
        *,
        method: str | None = None,
        path: str | None = None,
        count: int | None = None,
        retry_after: int | None = None,
    ) -> Rule:
        """Answer matching requests with ``status`` and a Status body, without reaching the server.

        ``path`` is a regular expression searched in the request path (no query);
        ``count`` None means until ``clear()``.
        """
        rule = Rule(
            status,
            method=method.upper() if method else None,
            path=re.compile(path) if path is not None else None,
            count=count,
            retry_after=retry_after,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    def blackhole(self, on: bool) -> None:
        """While on, requests get no answer and open streams deliver nothing; when turned off,
        whatever a client is still waiting for goes through."""
        self._call(self._set_blackhole(on))

    async def _set_blackhole(self, on: bool) -> None:
        if on:
            self._passable.clear()
        else:
            self._passable.set()

    async def _pass(self) -> None:
        if self._passable.is_set():
            return
        self.held += 1
        try:
            await self._passable.wait()
        finally:
            self.held -= 1

    def _match(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.active and rule.matches(method, path):
                    rule.hits += 1
                    return rule
        return None

    # -- the proxy

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.requests += 1
        status = 0
        injected = False
        try:
            body = await request.read()
            await self._pass()
            rule = self._match(request.method, request.path)
            if rule is not None:
                injected, status = True, rule.status
                return self._status(rule, request)
            response = await self._forward(request, body)
            status = response.status
            return response
        finally:
            self._handlers.discard(task)
            self.seen.append(Seen(request.method, request.path, status, injected, time.monotonic()))

    def _status(self, rule: Rule, request: web.BaseRequest) -> web.Response:
        reason = REASONS.get(rule.status, "")
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"injected by the test proxy: {request.method} {request.path}",
            "reason": reason,
            "code": rule.status,
        }
        headers = {}
        if rule.retry_after is not None:
            headers["Retry-After"] = str(rule.retry_after)
            body["details"] = {"retryAfterSeconds": rule.retry_after}
        return web.Response(
            status=rule.status, headers=headers, body=json.dumps(body), content_type="application/json"
        )

    async def _forward(self, request: web.BaseRequest, body: bytes) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        session = self._bearer if "Authorization" in request.headers else self._admin
        assert session is not None
        try:
            upstream = await session.request(
                request.method,
                self.cp.url + request.path_qs,
                data=body or None,
                headers=headers,
                allow_redirects=False,
                # Watches run as long as the client asked; only connecting is bounded here.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        except (aiohttp.ClientError, OSError) as e:
            # What a load balancer with no healthy backend answers.
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": f"test proxy: upstream unreachable: {e}",
                    "reason": "ServiceUnavailable",
                    "code": 503,
                },
                status=503,
            )
        async with upstream:
            try:
                return await self._relay(request, upstream)
            except BaseException:
                # The client left half-way (a watch, usually): drop the upstream connection
                # at once. A TLS close would wait for the server's close_notify, which a
                # running watch never sends, and outlive the proxy.
                if upstream.connection is not None and upstream.connection.transport is not None:
                    upstream.connection.transport.abort()
                raise

    async def _relay(self, request: web.BaseRequest, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        await self._pass()
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _HOP_BY_HOP:
                out.headers.add(key, value)
        if upstream.content_length is not None:
            out.content_length = upstream.content_length
        await out.prepare(request)
        async for chunk in upstream.content.iter_any():
            # A stream stalls in the black hole instead of delivering.
            await self._pass()
            await out.write(chunk)
        await out.write_eof()
        return out

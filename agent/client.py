"""The agent's one HTTP boundary: PATCH a lease through the external name with httpx.

Every httpx exception is translated into core.errors here. The connection is
kept alive (HTTP/2 where the server offers it) but never older than a minute,
and a caller can ask for a fresh one: a new connection means a new DNS lookup,
so a moved load balancer is followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx

from agent.settings import Settings
from core.credentials import TokenFile
from core.errors import BadResponse, TransportError, TransportKind, api_error
from core.lease import lease_path

MAX_CONNECTION_AGE_S = 60.0


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


def ssl_context(ca_file: str) -> ssl.SSLContext:
    """Verify against the CA file, or the system store when none is given."""
    ctx = ssl.create_default_context(cafile=ca_file or None)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


class LeaseClient:
    def __init__(
        self,
        base_url: str,
        namespace: str,
        name: str,
        token: TokenFile,
        ca_file: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url
        self.path = lease_path(namespace, name)
        self.token = token
        self.ca_file = ca_file
        self.clock = clock
        self._ssl = ssl_context(ca_file)
        self._client: httpx.AsyncClient | None = None
        self._born = 0.0
        self.connections_opened = 0

    @classmethod
    def for_settings(cls, settings: Settings) -> LeaseClient:
        return cls(
            settings.apiserver_url,
            settings.lease_namespace,
            settings.node_name,
            TokenFile(settings.token_file),
            settings.ca_file,
        )

    def _new_client(self) -> httpx.AsyncClient:
        self.connections_opened += 1
        self._born = self.clock()
        return httpx.AsyncClient(
            base_url=self.base_url,
            http2=True,
            verify=self._ssl,
            # The point is the external path: no proxy, no netrc, no SSL_CERT_FILE from the environment.
            trust_env=False,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=None),
            headers={"Accept": "application/json", "User-Agent": "dwd-lease-agent"},
        )

    async def _client_for(self, fresh: bool) -> httpx.AsyncClient:
        if self._client is not None and (fresh or self.clock() - self._born >= MAX_CONNECTION_AGE_S):
            await self.aclose()
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def reload_tls(self) -> None:
        """Re-read the CA file: after a tls failure the CA may have been rotated."""
        self._ssl = ssl_context(self.ca_file)

    async def patch(self, body: dict[str, Any], *, timeout_s: float, fresh: bool = False) -> dict[str, Any]:
        """Merge-patch the lease; returns the lease as the server stored it."""
        headers = {
            "Content-Type": "application/merge-patch+json",
            "Authorization": f"Bearer {self.token.read()}",
        }
        client = await self._client_for(fresh)
        try:
            # httpx's own timeouts fire first and clean up after themselves; the
            # outer bound only guarantees the total (httpx times each phase apart).
            async with asyncio.timeout(timeout_s):
                response = await client.patch(
                    self.path,
                    content=json.dumps(body, separators=(",", ":")).encode(),
                    headers=headers,
                    timeout=httpx.Timeout(timeout_s * 0.9),
                )
        except (httpx.TransportError, TimeoutError, OSError, ssl.SSLError) as e:
            # The connection is in an unknown state now; never reuse it.
            await self.aclose()
            raise TransportError(classify(e), str(e) or type(e).__name__) from e
        if response.status_code >= 300:
            raise api_error(response.status_code, response.content, response.headers)
        try:
            obj = response.json()
        except ValueError as e:
            raise BadResponse(f"PATCH {self.path}: response is not JSON") from e
        if not isinstance(obj, dict) or obj.get("kind") != "Lease":
            raise BadResponse(f"PATCH {self.path}: response is not a Lease")
        return obj

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # A broken connection may fail to close; it is dropped either way.
            with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
                await client.aclose()

"""The aggregator's one HTTP boundary: an asyncio Kubernetes API client on aiohttp.

JSON requests, lists and watches against the API server an ``Endpoint`` names (endpoint.py:
where it is, and the credentials, read from a kubeconfig and re-read as they change). aiohttp's
exceptions are translated into core.errors here and nowhere else.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Protocol

import aiohttp

from aggregator.kube.endpoint import Endpoint
from aggregator.kube.ratelimit import RateLimit
from core.errors import (
    BadResponse,
    TransportError,
    TransportKind,
    api_error,
    raise_for_watch_event,
)

RETIRED_SESSION_S = 60.0
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def classify(exc: BaseException) -> TransportKind:
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError | ssl.SSLError):
        return "tls"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    return "connect"


_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


@contextlib.contextmanager
def _translated(verb: str, path: str) -> Iterator[None]:
    """aiohttp's and the socket's failures as one ``TransportError`` that names the request."""
    try:
        yield
    except _TRANSPORT_ERRORS as e:
        raise TransportError(classify(e), f"{verb} {path}: {e or type(e).__name__}") from e


class KubeApi(Protocol):
    """What the aggregator asks of a client of one API server: KubeClient's verbs. Its users
    take this, so that a stand-in server (the unit tests') is checked against the same verbs."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]: ...

    async def get(self, path: str, **params: str) -> dict[str, Any]: ...

    async def create(self, path: str, body: Any) -> dict[str, Any]: ...

    async def merge_patch(self, path: str, body: Any) -> dict[str, Any]: ...

    async def delete(self, path: str, body: Any = None) -> dict[str, Any]: ...

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_s: float,
        accept: str | None = None,
        on_open: Callable[[], None] = ...,
        **params: str,
    ) -> AsyncIterator[dict[str, Any]]: ...

    async def probe(self, *, timeout_s: float, path: str = "/readyz") -> None: ...

    async def close(self) -> None: ...


class KubeClient:
    """JSON requests, lists and watches against one API server."""

    def __init__(
        self,
        endpoint: Callable[[], Endpoint],
        *,
        timeout_s: float = 10.0,
        user_agent: str = "dwd-lease-aggregator",
        connections: int = 16,
        rate: RateLimit | None = None,
    ) -> None:
        self._endpoint_source = endpoint
        self.rate = rate
        self.timeout_s = timeout_s
        self.user_agent = user_agent
        # HTTP/1.1: one request per connection at a time, so this bounds the requests in flight.
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._session_endpoint: Endpoint | None = None
        # Sessions of replaced credentials: a watch still reading one must end on
        # its own (closing a session under a reader can leave it hanging).
        self._retired: list[tuple[float, aiohttp.ClientSession]] = []

    def endpoint(self) -> Endpoint:
        return self._endpoint_source()

    def _headers(
        self, endpoint: Endpoint, *, accept: str | None = None, content_type: str | None = None
    ) -> dict[str, str]:
        """Every request's headers: the credentials of ``endpoint``, who asks, what it takes."""
        headers = endpoint.headers()
        headers.update({"User-Agent": self.user_agent, "Accept": accept or "application/json"})
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    async def _session_for(self, endpoint: Endpoint) -> aiohttp.ClientSession:
        if self._session is None or self._session_endpoint is not endpoint:
            now = time.monotonic()
            if self._session is not None:
                self._retired.append((now, self._session))
            for born, old in [r for r in self._retired if now - r[0] > RETIRED_SESSION_S]:
                self._retired.remove((born, old))
                await old.close()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=endpoint.ssl_context, limit=self.connections),
                # Watch lines hold whole objects; the 64 KiB default is too small for some.
                read_bufsize=2**22,
                trust_env=False,
            )
            self._session_endpoint = endpoint
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        if self.rate is not None:
            await self.rate.wait()
        endpoint = self.endpoint()
        session = await self._session_for(endpoint)
        headers = self._headers(endpoint, accept=accept, content_type=None if body is None else content_type)
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        data = None if body is None else json.dumps(body).encode()
        with _translated(method, path):
            async with session.request(
                method,
                endpoint.server + path,
                params=params,
                data=data,
                headers=headers,
                timeout=timeout,
                server_hostname=endpoint.server_name or None,
            ) as response:
                payload = await response.read()
                if response.status >= 300:
                    raise api_error(response.status, payload, response.headers)
        try:
            result = json.loads(payload)
        except ValueError as e:
            raise BadResponse(f"{method} {path}: response is not JSON") from e
        if not isinstance(result, dict):
            raise BadResponse(f"{method} {path}: response is not an object")
        return result

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    async def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        return await self.request("DELETE", path, body=body)

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_s: float,
        accept: str | None = None,
        on_open: Callable[[], None] = lambda: None,
        **params: str,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (BOOKMARK included) until the server ends the watch after ``timeout_s``.

        ``on_open`` is called once the server has accepted the watch (status 200).
        An ERROR event (e.g. 410 Gone: the resourceVersion is too old) is raised as its ApiError.
        """
        endpoint = self.endpoint()
        session = await self._session_for(endpoint)
        headers = self._headers(endpoint, accept=accept)
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(max(1, round(timeout_s))),
            **params,
        }
        # The server ends the watch itself; a read gap well past its bookmark
        # cadence means the connection is dead.
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_read=timeout_s + 10)
        try:
            with _translated("WATCH", path):
                async with session.get(
                    endpoint.server + path,
                    params=query,
                    headers=headers,
                    timeout=timeout,
                    server_hostname=endpoint.server_name or None,
                ) as response:
                    if response.status >= 300:
                        raise api_error(response.status, await response.read(), response.headers)
                    on_open()
                    async for line in response.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        raise_for_watch_event(event)
                        yield event
        except ValueError as e:
            raise BadResponse(f"WATCH {path}: an event is not JSON") from e

    async def probe(self, *, timeout_s: float, path: str = "/readyz") -> None:
        """A request on a new connection: a half-broken kept-alive one must not fake health."""
        endpoint = self.endpoint()
        with _translated("probe", path):
            async with (
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=endpoint.ssl_context, force_close=True),
                    trust_env=False,
                ) as session,
                session.get(
                    endpoint.server + path,
                    headers=self._headers(endpoint),
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                    server_hostname=endpoint.server_name or None,
                ) as response,
            ):
                body = await response.read()
                if response.status != 200:
                    raise api_error(response.status, body, response.headers)

    async def close(self) -> None:
        sessions = [s for _, s in self._retired] + ([self._session] if self._session is not None else [])
        self._session, self._session_endpoint, self._retired = None, None, []
        for session in sessions:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                await session.close()

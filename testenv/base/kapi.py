"""A small synchronous API client for tests and the demo (admin certificate or bearer token)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from core.errors import Conflict, Forbidden, api_error, raise_for_watch_event
from core.lease import DEFAULT_LEASE_NAMESPACE, LEASE_SELECTOR, leases_path, node_of


class Client:
    def __init__(
        self,
        url: str,
        ca_file: str,
        *,
        cert: tuple[str, str] | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        ctx = ssl.create_default_context(cafile=ca_file)
        if cert is not None:
            ctx.load_cert_chain(*cert)
        self.warnings: list[str] = []
        self.last_headers: httpx.Headers = httpx.Headers()
        self.http = httpx.Client(
            base_url=url, verify=ctx, headers=headers, timeout=timeout_s, trust_env=False
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if body is not None else {}
        response = self.http.request(method, path, content=content, headers=headers, params=params)
        # API warnings (deprecations, unknown fields): a test can assert there were none.
        self.warnings = response.headers.get_list("Warning")
        self.last_headers = response.headers
        if response.status_code >= 300:
            raise api_error(response.status_code, response.content, response.headers)
        result: dict[str, Any] = response.json()
        return result

    def get(self, path: str, **params: str) -> dict[str, Any]:
        return self.request("GET", path, params=params or None)

    def create(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str) -> dict[str, Any]:
        return self.request("DELETE", path)

    def ensure(self, path: str, body: Any) -> dict[str, Any]:
        """Create, or return the existing object of that name (idempotent set-up)."""
        try:
            return self.create(path, body)
        except Conflict:
            return self.get(f"{path}/{body['metadata']['name']}")

    def watch(self, path: str, timeout_s: float = 10.0, **params: str) -> Iterator[dict[str, Any]]:
        """Watch events as dicts until the server closes the stream or the timeout passes."""
        query = {"watch": "true", "timeoutSeconds": str(max(1, int(timeout_s))), **params}
        with self.http.stream("GET", path, params=query, timeout=timeout_s + 5) as response:
            if response.status_code >= 300:
                response.read()
                raise api_error(response.status_code, response.content, response.headers)
            for line in response.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                raise_for_watch_event(event)
                yield event


def unless_forbidden(call: Callable[[], Any]) -> Any:
    """What ``call`` answers, or None when it is refused (RBAC or admission not there yet)."""
    try:
        return call()
    except Forbidden:
        return None


def denial(call: Callable[[], Any]) -> str:
    """The message of a Forbidden answer to ``call``; "" when it was allowed."""
    try:
        call()
    except Forbidden as e:
        return str(e)
    return ""


def node_leases(c: Client, namespace: str = DEFAULT_LEASE_NAMESPACE) -> dict[str, dict[str, Any]]:
    """The agents' leases by node, as the aggregator selects them (the namespace is shared)."""
    items = c.get(leases_path(namespace), labelSelector=LEASE_SELECTOR)["items"]
    return {node: i for i in items if (node := node_of(i["metadata"]["name"])) is not None}

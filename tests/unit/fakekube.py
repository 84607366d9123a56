"""A small dict-backed stand-in for a Kubernetes API server, for unit tests of the aggregator's I/O.

It speaks the subset KubeClient's callers use (GET of objects and collections,
POST, merge PATCH with a resourceVersion precondition, the scale subresource,
DELETE, probe, watch) and lets a test script failures per request. Its deployment
"controller" makes status follow spec at once, unless told not to.
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from core.errors import Conflict, KubeError, NotFound, TransportError, api_error, raise_for_watch_event

Fault = Callable[[str, str], KubeError | None]


@dataclass
class Rule:
    method: str | None
    path: str | None
    error: Callable[[], KubeError]
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or re.search(self.path, path) is not None
        )


def server_error(message: str = "injected") -> KubeError:
    return api_error(500, f'{{"reason":"InternalError","message":"{message}"}}')


def transport_error() -> KubeError:
    return TransportError("connect", "injected: connection refused")


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rules: list[Rule] = []
        self.down = False
        self.hang: Rule | None = None
        self.controller = True
        self.writes: list[tuple[str, str, Any]] = []
        # Events the next watches deliver, one list per watch, before it ends quietly.
        self.watches: list[list[dict[str, Any]]] = []
        # The timeout each watch asked the server for.
        self.watch_timeouts: list[float] = []
        self._rv = 0
        # The server's wall clock, for metadata.managedFields times.
        self.wall: Callable[[], str] = lambda: "2026-11-30T12:00:00Z"
        # Told (method, path) of every request before it is served: a test's hook into time.
        self.on_request: Callable[[str, str], object] = lambda _method, _path: None
        # Writes that match ``held`` are taken in and not applied: the caller gives up (a time-out,
        # as a slow server answers), and each lands later, when a test calls ``land``, checked
        # against the object as it is then (a write a client gave up on may still be applied).
        self.held: list[Rule] = []
        self.pending: list[tuple[str, str, Any]] = []

    # -- test controls
    def fail(
        self,
        method: str | None = None,
        path: str | None = None,
        error: Callable[[], KubeError] = server_error,
    ) -> Rule:
        rule = Rule(method, path, error)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def hold(self, method: str | None = None, path: str | None = None) -> Rule:
        rule = Rule(method, path, transport_error)
        self.held.append(rule)
        return rule

    def land(self) -> list[KubeError | None]:
        """Apply the held writes in the order they were sent; what each would have answered."""
        pending, self.pending, self.held = self.pending, [], []
        outcomes: list[KubeError | None] = []
        for method, path, body in pending:
            try:
                self._write(method, path, body)
                outcomes.append(None)
            except KubeError as e:
                outcomes.append(e)
        return outcomes

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta["name"] = path.rsplit("/", 1)[1]
        if (namespaced := re.search(r"/namespaces/([^/]+)/", path)) is not None:
            meta["namespace"] = namespaced.group(1)
        meta["resourceVersion"] = self._next_rv()
        self.objects[path] = obj
        return obj

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # -- the API
    async def _arrive(self, method: str, path: str) -> None:
        """A request as it reaches the server: told, held if it hangs, failed if a rule says so."""
        self.on_request(method, path)
        if self.hang is not None and self.hang.matches(method, path):
            self.hang.hits += 1
            await asyncio.Event().wait()  # held until the caller gives up
        self._check(method, path)

    def _check(self, method: str, path: str) -> None:
        if self.down:
            raise transport_error()
        for rule in self.rules:
            if rule.matches(method, path):
                rule.hits += 1
                raise rule.error()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Any = None,
        content_type: str = "application/json",
        accept: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        del content_type, accept, timeout_s
        await self._arrive(method, path)
        await asyncio.sleep(0)
        if method != "GET" and any(rule.matches(method, path) for rule in self.held):
            self.pending.append((method, path, copy.deepcopy(body)))
            raise TransportError("timeout", f"injected: {method} {path} held by the server", sent=True)
        if method == "GET":
            params = params or {}
            return _page(
                self._get(path, params.get("labelSelector", ""), params.get("fieldSelector", "")), params
            )
        return self._write(method, path, body)

    def _write(self, method: str, path: str, body: Any) -> dict[str, Any]:
        if method == "POST":
            return self._create(path, body)
        if method == "PATCH":
            return self._patch(path, body)
        if method == "PUT":
            return self._put(path, body)
        if method == "DELETE":
            obj = self.objects.get(path)
            if obj is None:
                raise NotFound(404, "NotFound", path)
            if obj["metadata"].get("finalizers"):  # the server waits for their owners
                obj["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
                return copy.deepcopy(obj)
            del self.objects[path]
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    async def get(self, path: str, **params: str) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def merge_patch(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body)

    async def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        return await self.request("DELETE", path)

    async def probe(self, *, timeout_s: float, path: str = "/readyz") -> None:
        await self._arrive("GET", path)

    async def watch(
        self, path: str, *, resource_version: str, timeout_s: float, accept: str | None = None, **kw: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self._check("GET", path + "?watch")
        self.watch_timeouts.append(timeout_s)
        on_open = kw.get("on_open")
        if on_open is not None:
            on_open()
        for event in self.watches.pop(0) if self.watches else ():
            raise_for_watch_event(event)
            yield event
        await asyncio.sleep(0.01)  # then ends without more events, as a quiet watch does

    async def close(self) -> None:
        pass

    def _get(self, path: str, selector: str = "", fields: str = "") -> dict[str, Any]:
        if (across := _ACROSS_NAMESPACES.match(path)) is not None:
            # A collection across every namespace, filtered by a label selector (key or key=value)
            # and by name (fieldSelector metadata.name=...).
            group, kind = across.groups()
            pattern = re.compile(rf"^{re.escape(group)}/namespaces/[^/]+/{kind}/[^/]+$")
            items = [copy.deepcopy(o) for p, o in sorted(self.objects.items()) if pattern.match(p)]
            name = fields.removeprefix("metadata.name=")
            return {
                "items": [
                    o for o in items if _selects(selector, o) and (not name or o["metadata"]["name"] == name)
                ],
                "metadata": {"resourceVersion": str(self._rv)},
            }
        if path in self.objects:
            return copy.deepcopy(self.objects[path])
        if path.endswith("/scale") and path[:-6] in self.objects:
            obj = self.objects[path[:-6]]
            return {"metadata": dict(obj["metadata"]), "spec": {"replicas": obj["spec"].get("replicas", 1)}}
        prefix = path + "/"
        items = [
            copy.deepcopy(o)
            for p, o in sorted(self.objects.items())
            if p.startswith(prefix) and "/" not in p[len(prefix) :] and _selects(selector, o)
        ]
        if (
            items
            or any(p.startswith(prefix) for p in self.objects)
            or path.endswith(("/leases", "/nodes", "/events"))
        ):
            return {"items": items, "metadata": {"resourceVersion": str(self._rv)}}
        raise NotFound(404, "NotFound", path)

    def _create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or f"{meta.get('generateName', 'obj-')}{self._rv}"
        path = f"{collection}/{name}"
        if path in self.objects:
            raise Conflict(409, "AlreadyExists", path)
        self.writes.append(("POST", collection, body))
        self._manage(body, body)
        return self.put(path, body)

    def _put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = self.objects.get(path)
        if obj is None:
            raise NotFound(404, "NotFound", path)
        if body["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", f"{path}: the object has been modified")
        self.writes.append(("PUT", path, copy.deepcopy(body)))
        return self.put(path, body)

    def _patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/status") and path[:-7] in self.objects:
            # The status subresource: only the status changes, whatever else the body says.
            self.writes.append(("PATCH", path, copy.deepcopy(body)))
            subject = self.objects[path[:-7]]
            _merge(subject.setdefault("status", {}), body.get("status") or {})
            subject["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(subject)
        scale = path.endswith("/scale")
        target = path[:-6] if scale else path
        obj = self.objects.get(target)
        if obj is None:
            raise NotFound(404, "NotFound", path)
        want_rv = (body.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", f"{path}: the object has been modified")
        self.writes.append(("PATCH", path, copy.deepcopy(body)))
        if scale:
            obj["spec"]["replicas"] = body["spec"]["replicas"]
            if self.controller:
                self.follow(target)
        else:
            _merge(obj, body)
            self._manage(obj, body)
            if self.controller and "replicas" in (body.get("spec") or {}):
                self.follow(target)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        if obj["metadata"].get("deletionTimestamp") and not obj["metadata"].get("finalizers"):
            del self.objects[target]  # the last finalizer gone: the server deletes it
        return copy.deepcopy(obj)

    def _manage(self, obj: dict[str, Any], body: dict[str, Any]) -> None:
        """Stamp the writer's managedFields entry, as the server does (all requests here are the
        aggregator's; a test's own writes stamp theirs with ``managed``)."""
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if annotations:
            managed(
                obj,
                "dwd-lease-aggregator",
                self.wall(),
                {"f:metadata": {"f:annotations": {f"f:{k}": {} for k in annotations}}},
            )

    def follow(self, path: str) -> None:
        """What the deployment controller does: status follows spec."""
        obj = self.objects[path]
        want = obj["spec"].get("replicas", 1)
        obj["status"] = {"replicas": want, "readyReplicas": want}
        obj["metadata"]["resourceVersion"] = self._next_rv()


_ACROSS_NAMESPACES = re.compile(
    r"^(/apis/[^/]+/[^/]+|/api/v1)/(deployments|statefulsets|secrets|extensions)$"
)


def _page(result: dict[str, Any], params: dict[str, str]) -> dict[str, Any]:
    """A collection in pages of ``limit``, the continue token the offset of the next page."""
    items = result.get("items")
    if "limit" not in params or not isinstance(items, list):
        return result
    start, limit = int(params.get("continue") or 0), int(params["limit"])
    meta = dict(result.get("metadata") or {})
    meta.pop("continue", None)
    if start + limit < len(items):
        meta["continue"] = str(start + limit)
    return {**result, "items": items[start : start + limit], "metadata": meta}


def _selects(selector: str, obj: dict[str, Any]) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    key, _, value = selector.partition("=")
    return key in labels and (not value or labels[key] == value)


def managed(obj: dict[str, Any], manager: str, when: str, fields: dict[str, Any]) -> None:
    entries = obj.setdefault("metadata", {}).setdefault("managedFields", [])
    for entry in entries:
        if entry["manager"] == manager:
            entry["time"], entry["fieldsV1"] = when, fields
            return
    entries.append({"manager": manager, "operation": "Update", "time": when, "fieldsV1": fields})


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 merge patch."""
    for key, value in patch.items():
        if key == "resourceVersion":
            continue
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)

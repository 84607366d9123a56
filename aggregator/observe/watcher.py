"""List+watch, and the observed state the decider reads.

An Informer lists a collection, then watches it from the list's
resourceVersion with bookmarks on; a 410 Gone means re-list, any other failure
a jittered back-off and a resumed watch. Freshness means data received from the
server (a LIST, a watch the server accepted, an event or a bookmark), never an
attempt: a watch that keeps failing is not fresh, however often it is retried.

The observed state stamps the local monotonic clock when a lease's renewTime
is seen to change: staleness is measured where it is observed, never from the
node's own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from aggregator.kube.client import METADATA_LIST, METADATA_ONLY, KubeApi
from aggregator.model.objects import NodeView, metadata, resource_version
from aggregator.model.observed import LeaseObs, NodeObs, micro_time
from aggregator.model.settings import WatchSettings
from core import logs
from core.errors import BadResponse, Forbidden, Gone, KubeError, NotFound, TransportError
from core.lease import LEASE_SELECTOR, LeaseView, leases_path

log = logs.get("watcher")

V = TypeVar("V")

# Synchronous work longer than this holds up every target of the process.
BLOCKED_S = 0.1


class Informer(Generic[V]):
    """List+watch of one collection; every object is parsed into its view (``parse``) on
    arrival, and one that does not parse is skipped."""

    def __init__(
        self,
        client: KubeApi,
        path: str,
        *,
        name: str,
        parse: Callable[[Mapping[str, Any]], V],
        on_list: Callable[[list[V]], None],
        on_event: Callable[[str, V], None],
        accept: str | None = None,
        list_accept: str | None = None,
        settings: WatchSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "",
        page_size: int | None = None,
        params: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.path = path
        self.params = dict(params or {})
        self.name = name
        self.parse = parse
        self.on_list = on_list
        self.on_event = on_event
        self.accept = accept
        self.list_accept = list_accept or accept
        # LIST in pages of this many (None: in one): a page's objects are parsed and dropped
        # before the next arrives, so full Node objects never sit in memory all at once.
        self.page_size = page_size
        self.settings = settings or WatchSettings()
        self.clock = clock
        self.synced = asyncio.Event()
        # Our clock when the server last answered with data; -inf: never.
        self.last_data = float("-inf")
        # The watch is failing now (cleared by the next answer from the server).
        self.failing = False
        self.resource_version = ""
        self.last_error = ""
        self.log = log.bind(target=label, resource=name)
        self.on_restart: Callable[[str], None] = lambda _reason: None

    def _view(self, obj: Mapping[str, Any]) -> V | None:
        try:
            return self.parse(obj)
        except ValueError:
            return None

    async def list_now(self) -> None:
        """A consistent LIST (read from etcd, not the watch cache) fed through on_list. Paged,
        every page comes from the first one's snapshot (an expired continue token is a 410:
        the caller lists again)."""
        views: list[V] = []
        page: dict[str, str] = {"limit": str(self.page_size)} if self.page_size else {}
        took = 0.0
        try:
            while True:
                result = await self.client.request(
                    "GET", self.path, params={**self.params, **page} or None, accept=self.list_accept
                )
                started = time.monotonic()
                views.extend(v for v in map(self._view, list_items(self.path, result)) if v is not None)
                took += time.monotonic() - started
                token = metadata(result).get("continue")
                if not self.page_size or not token:
                    break
                page = {"limit": str(self.page_size), "continue": str(token)}
        except KubeError:
            self.failing = True
            raise
        self.resource_version = resource_version(result)
        self._received()
        started = time.monotonic()
        self.on_list(views)
        # Every target shares the loop; one that parses for long is a gap in every view.
        if (took := took + time.monotonic() - started) > BLOCKED_S:
            self.log.warning("list_blocked_loop", items=len(views), took_s=round(took, 3))

    async def run(self) -> None:
        delays = self.settings.backoff.delays()
        need_list = True
        while True:
            timeout_s = self.settings.watch_timeout_s()
            try:
                if need_list or not self.resource_version:
                    await self.list_now()
                    self.synced.set()
                    need_list = False
                # The server ends every watch after its timeout; one that runs far
                # longer sits on a dead connection that no read timeout noticed.
                async with asyncio.timeout(timeout_s + self.settings.grace_s):
                    await self._watch_once(timeout_s)
                # A watch that ran to its timeout is healthy: resume at once.
                delays = self.settings.backoff.delays()
                self.last_error = ""
            except Gone:
                self.on_restart("gone")
                self.log.info("watch_expired_relisting", resource_version=self.resource_version)
                need_list = True
            except (KubeError, TimeoutError) as e:
                if isinstance(e, TimeoutError):
                    grace_s = self.settings.grace_s
                    why = f"WATCH {self.path}: no end {grace_s:g}s past its timeout of {timeout_s:.2f}s"
                    e = TransportError("timeout", why)
                # Like client-go's reflector: resume the watch from the last
                # resourceVersion (cheap, served from the watch cache); only a
                # 410 or a failed list costs a re-list.
                self.failing = True
                self.on_restart(e.failure_class)
                delay_s = next(delays)
                if str(e) != self.last_error:
                    self.log.warning("watch_failed", error=str(e), retry_in=round(delay_s, 2))
                self.last_error = str(e)
                await asyncio.sleep(self.settings.backoff.spread(delay_s))

    async def _watch_once(self, timeout_s: float) -> None:
        async for event in self.client.watch(
            self.path,
            resource_version=self.resource_version,
            timeout_s=timeout_s,
            accept=self.accept,
            on_open=self._received,
            **self.params,
        ):
            self._received()
            obj = event.get("object") or {}
            if rv := metadata(obj).get("resourceVersion"):
                self.resource_version = str(rv)
            if event.get("type") != "BOOKMARK" and (view := self._view(obj)) is not None:
                self.on_event(str(event.get("type")), view)

    def _received(self) -> None:
        self.last_data = self.clock()
        self.failing = False

    async def first_list(self, timeout_s: float) -> bool:
        """Wait for the first LIST, at most ``timeout_s``; whether it has come."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that arrives as the
        # event is set, and the loop around it would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.synced.wait()
        return self.synced.is_set()

    def fresh(self, max_age_s: float) -> bool:
        """The server answered with data within ``max_age_s`` and the watch is not failing now."""
        return not self.failing and self.clock() - self.last_data <= max_age_s


@dataclass
class Observed:
    """Nodes and leases as this aggregator has seen them."""

    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    nodes: dict[str, NodeObs] = field(default_factory=dict)
    # Each node's renewals as judged: of its lease (``own``) and, during a move from the old
    # layout, its lease there (``legacy``), the one renewed last as far as we have seen.
    leases: dict[str, LeaseObs] = field(default_factory=dict)
    # The leases of ours, what the provisioner keeps in line with the nodes.
    own: dict[str, LeaseObs] = field(default_factory=dict)
    legacy: dict[str, LeaseObs] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- nodes
    def _node(self, view: NodeView) -> NodeObs:
        created = view.created
        age_s = max(0.0, (self.wall() - created).total_seconds()) if created else 0.0
        return NodeObs(view, created_mono=self.clock() - age_s)

    def nodes_listed(self, views: list[NodeView]) -> None:
        self.nodes = {v.name: self._node(v) for v in views}
        self.changed.set()

    def node_event(self, kind: str, view: NodeView) -> None:
        previous = self.nodes.get(view.name)
        if kind == "DELETED":
            self.nodes.pop(view.name, None)
        else:
            self.nodes[view.name] = self._node(view)
        # The provisioner acts on a node's name and uid only. Watched in full, a node changes
        # with every status update its kubelet posts; a pass over every lease for each of
        # those would run at that rate.
        if kind == "DELETED" or previous is None or previous.view.uid != view.uid:
            self.changed.set()

    # -- leases
    def _lease(self, view: LeaseView, previous: LeaseObs | None) -> LeaseObs:
        # First sight or a changed renewTime: renewed "now" as far as we can tell.
        # First sight is generous on purpose: a just-started aggregator must not
        # call a lease stale before it has watched it for a whole lease duration.
        now = self.clock()
        if previous is None or previous.view.renew_time != view.renew_time:
            seen = now
        else:
            seen = previous.seen_renewed_mono
        if previous is None:
            # Only a renewal made after the interval was set proves the agent renews at
            # that pace. At first sight the server's own record of who wrote last says so.
            paced = float("-inf") if view.renewed_after_interval else now
        elif previous.view.interval_s != view.interval_s:
            paced = now
        else:
            paced = previous.paced_since_mono
        return LeaseObs(view, seen_renewed_mono=seen, paced_since_mono=paced)

    def leases_listed(self, views: list[LeaseView]) -> None:
        self.own = {v.name: self._lease(v, self.own.get(v.name)) for v in views}
        self._merge_all()
        self.changed.set()

    def lease_event(self, kind: str, view: LeaseView) -> None:
        previous = self._event(self.own, kind, view)
        # A renewal changes nothing the provisioner acts on: waking it for each one made its
        # pass over every node run at the renewal rate (70 % of a core at 5000 nodes).
        if kind == "DELETED" or previous is None or not _only_renewed(previous.view, view):
            self.changed.set()

    def legacy_listed(self, views: list[LeaseView]) -> None:
        self.legacy = {v.name: self._lease(v, self.legacy.get(v.name)) for v in views}
        self._merge_all()

    def legacy_event(self, kind: str, view: LeaseView) -> None:
        self._event(self.legacy, kind, view)

    def _event(self, leases: dict[str, LeaseObs], kind: str, view: LeaseView) -> LeaseObs | None:
        previous = leases.get(view.name)
        if kind == "DELETED":
            leases.pop(view.name, None)
        else:
            leases[view.name] = self._lease(view, previous)
        self._merge(view.name)
        return previous

    def _merge(self, node: str) -> None:
        own, legacy = self.own.get(node), self.legacy.get(node)
        if own is None or legacy is None:
            chosen = own or legacy
        else:  # the later renewal seen; ours on a tie
            chosen = legacy if legacy.seen_renewed_mono > own.seen_renewed_mono else own
            chosen = _released_by_either(chosen, own if chosen is legacy else legacy)
        if chosen is None:
            self.leases.pop(node, None)
        else:
            self.leases[node] = chosen

    def _merge_all(self) -> None:
        self.leases = {}
        for node in self.own.keys() | self.legacy.keys():
            self._merge(node)

    def lease_ages(self) -> dict[str, float]:
        now = self.clock()
        return {name: now - lease.seen_renewed_mono for name, lease in self.leases.items()}


def _released_by_either(chosen: LeaseObs, other: LeaseObs) -> LeaseObs:
    """The lease judged, released where the other layout's was released in the same round of
    renewals (an agent of 0.2.0 releases only ours; the old layout's, renewed just after it, is
    the later one): a successor's renewal comes later than that round."""
    if chosen.view.released or not other.view.released:
        return chosen
    if _apart(chosen, other) > (other.view.interval_s or 0.0):
        return chosen
    return replace(chosen, view=replace(chosen.view, released=True))


def _apart(later: LeaseObs, earlier: LeaseObs) -> float:
    """How long after ``earlier`` its node renewed ``later``: by the node's own clock where both
    carry a renewTime (one agent stamps both in one round; the two layouts' watches may deliver
    them seconds apart under load, which once read a roll's releases as renewals), else by
    when we saw them."""
    a, b = micro_time(later.view.renew_time), micro_time(earlier.view.renew_time)
    if a is not None and b is not None:
        return (a - b).total_seconds()
    return later.seen_renewed_mono - earlier.seen_renewed_mono


def list_items(path: str, result: Mapping[str, Any]) -> list[Any]:
    """A LIST answer's items. An empty PartialObjectMetadataList comes without ``items`` at
    all (a shoot with no nodes yet): a list kind with a resourceVersion is an empty list, not a
    bad answer; anything else without items is."""
    items = result.get("items")
    if isinstance(items, list):
        return items
    if items is None and str(result.get("kind", "")).endswith("List") and resource_version(result):
        return []
    raise BadResponse(f"LIST {path}: no items")


def _only_renewed(before: LeaseView, after: LeaseView) -> bool:
    """Whether a lease changed only as a renewal changes it: its renewTime, the server's record
    of it, and the agent's evidence of an unseen renewal (written and cleared by renewals)."""
    renewed = replace(
        before,
        renew_time=after.renew_time,
        renewed_after_interval=after.renewed_after_interval,
        previous_renew=after.previous_renew,
        annotated=after.annotated,
    )
    return renewed == after


# Pages of a full Node LIST: one LIST of 5000 nodes is 56 MiB that parse into 220 MiB more
# (bench.node_objects at 3458592, docs/scale.md); client-go's reflector pages by 500 too.
NODE_PAGE = 500


def shoot_informers(
    shoot: KubeApi,
    observed: Observed,
    *,
    lease_namespace: str,
    full_nodes: bool,
    settings: WatchSettings,
    clock: Callable[[], float],
    label: str,
    on_restart: Callable[[str, str], None],
) -> tuple[Informer[NodeView], Informer[LeaseView]]:
    """A shoot's two watches, feeding ``observed``: its nodes (metadata only unless the
    conditions are read: unhealthy, in-place update) and the agents' leases."""
    common: dict[str, Any] = {"settings": settings, "clock": clock, "label": label}
    nodes = Informer(
        shoot,
        "/api/v1/nodes",
        name="nodes",
        parse=NodeView.from_object,
        on_list=observed.nodes_listed,
        on_event=observed.node_event,
        accept=None if full_nodes else METADATA_ONLY,
        list_accept=None if full_nodes else METADATA_LIST,
        page_size=NODE_PAGE if full_nodes else None,
        **common,
    )
    leases = Informer(
        shoot,
        leases_path(lease_namespace),
        name="leases",
        parse=LeaseView.from_object,
        # Only ours: the namespace is shared (kube-system).
        params={"labelSelector": LEASE_SELECTOR},
        on_list=observed.leases_listed,
        on_event=observed.lease_event,
        **common,
    )
    for informer in (nodes, leases):
        informer.on_restart = functools.partial(on_restart, informer.name)
    return nodes, leases


def legacy_informer(
    shoot: KubeApi,
    observed: Observed,
    namespace: str,
    *,
    settings: WatchSettings,
    clock: Callable[[], float],
    label: str,
) -> Informer[LeaseView]:
    """The old layout's leases (docs/install.md, "Moving an installation"): read, never written."""
    return Informer(
        shoot,
        leases_path(namespace),
        name="legacy-leases",
        parse=functools.partial(LeaseView.from_object, legacy=True),
        on_list=observed.legacy_listed,
        on_event=observed.legacy_event,
        settings=settings,
        clock=clock,
        label=label,
    )


async def follow_legacy(informer: Informer[LeaseView], log: Any) -> None:
    """Follows the old layout while it is there: a first LIST that is refused or finds no such
    namespace (a fresh install, or a move that is done) ends it, quietly."""
    try:
        await informer.list_now()
    except (Forbidden, NotFound) as e:
        log.info("legacy_leases_absent", namespace=informer.path, why=e.failure_class)
        return
    except KubeError as e:
        log.info("legacy_leases_unread", why=str(e))  # the informer's own retries take it from here
    await informer.run()

"""The lease contract between the agent and the aggregator (docs/design.md, "The lease contract").

One coordination.k8s.io/v1 Lease per node, named ``dwd-node-lease-<node>`` and labelled
``LEASE_LABEL``, in kube-system: where a shoot's gardener-resource-manager can deliver the
agent's RBAC, and where no node name can collide with ours (kube-node-lease is named by
nodes: see docs/design.md, "Where the leases live"). The agent writes holderIdentity,
renewTime and two annotations; the aggregator writes the owner reference,
leaseDurationSeconds and the interval.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.config import var
from core.durations import format_duration, parse_duration

DEFAULT_LEASE_NAMESPACE = "kube-system"
# Where the leases lived before (one per node, named like the node, unlabelled): read by the
# aggregator and renewed by the agent during the move (docs/install.md, "Moving an installation").
LEGACY_LEASE_NAMESPACE = "dwd-node-lease"
LEASE_PREFIX = "dwd-node-lease-"
# On every lease of ours; the aggregator lists, watches and deletes only leases that carry it.
LEASE_LABEL = "dependency-watchdog.gardener.cloud/node-lease"
LEASE_SELECTOR = LEASE_LABEL + "=true"
# The longest node name whose lease name is still a valid object name.
MAX_NODE_NAME = 253 - len(LEASE_PREFIX)

PREFIX = "dependency-watchdog.gardener.cloud/"
RENEW_INTERVAL = PREFIX + "renew-interval"
RELEASED = PREFIX + "released"
LAST_OUTAGE = PREFIX + "last-outage"
# renewTime as it was just before the agent's renewal overwrote it (see evidence_patch).
PREVIOUS_RENEW = PREFIX + "previous-renew-time"
IGNORE_NODE = PREFIX + "ignore-node"
# The uid of the node a lease is for, where the lease is owned by the agent's DaemonSet.
NODE_UID = PREFIX + "node-uid"
# The renew-interval contract: the aggregator hands out an interval in this range and the agent
# clamps one it is handed to it (a typo there must neither hammer KAPI nor silence a node); both
# start at the default until the annotation says otherwise. A renewal may take twice the
# interval, never longer than kubelet's own request timeout (about 10 s).
MIN_RENEW_INTERVAL_S = 0.2
MAX_RENEW_INTERVAL_S = 300.0
DEFAULT_RENEW_INTERVAL_S = 2.0
MAX_RENEWAL_WINDOW_S = 10.0


def renew_interval_var() -> Any:
    """DWD_RENEW_INTERVAL, one variable on both sides: the agent's interval until the annotation
    says otherwise, the aggregator's fast interval (its lease duration is at least twice it)."""
    return var(
        "DWD_RENEW_INTERVAL",
        DEFAULT_RENEW_INTERVAL_S,
        "duration",
        min_s=MIN_RENEW_INTERVAL_S,
        max_s=MAX_RENEW_INTERVAL_S,
    )


# The agent's DaemonSet: it owns the leases beside it, so they go with it (an uninstall).
AGENT_DAEMONSET = "dwd-lease-agent"

# The API server parses MicroTime with the fixed layout
# 2006-01-02T15:04:05.000000Z07:00: exactly six fractional digits.
# The two wire forms of time, checked before fromisoformat (which accepts many more);
# strptime would load _strptime and calendar into the agent, and is 20 times slower.
_MICRO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")

# RFC 1123 DNS subdomain, the rule for node and lease names.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def format_micro_time(when: datetime) -> str:
    """MicroTime with six fractional digits always (isoformat drops them at microsecond 0)."""
    if when.tzinfo is None:
        raise ValueError("MicroTime needs an aware datetime")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str) -> datetime:
    if not _MICRO_TIME.fullmatch(text):
        raise ValueError(f"not a MicroTime (YYYY-MM-DDTHH:MM:SS.ffffffZ): {text!r}")
    return datetime.fromisoformat(text)


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and bool(_DNS_LABEL.match(name))


def lease_name(node: str) -> str:
    """The name of ``node``'s lease; ValueError for a name too long to carry the prefix."""
    if len(node) > MAX_NODE_NAME:
        raise ValueError(
            f"node name {node[:40]}... is {len(node)} characters: a lease name holds {MAX_NODE_NAME} after "
            f"the prefix {LEASE_PREFIX!r}"
        )
    return LEASE_PREFIX + node


def node_of(name: str) -> str | None:
    """The node a lease of ours is for; None for a name that is not one of ours."""
    node = name.removeprefix(LEASE_PREFIX)
    return node if node != name and node else None


def lease_metadata(node: str) -> dict[str, Any]:
    """The name and label that make a lease ``node``'s and ours."""
    return {"name": lease_name(node), "labels": {LEASE_LABEL: "true"}}


def node_lease_path(namespace: str, node: str) -> str:
    return lease_path(namespace, lease_name(node))


def lease_path(namespace: str, name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"


def leases_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


@dataclass(frozen=True)
class Outage:
    """What the agent reports about its last outage once it has recovered.

    ``path``: what the first failed renewal saw, step by step, and the last request that
    worked before it, so an operator can tell a slow path from a broken one.
    """

    start: datetime
    duration_s: float
    failure_class: str
    path: Mapping[str, Any] | None = None

    def to_annotation(self) -> str:
        raw: dict[str, Any] = {
            "start": format_micro_time(self.start),
            "duration": format_duration(self.duration_s),
            "class": self.failure_class,
        }
        if self.path:
            raw["path"] = self.path
        return json.dumps(raw, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str) -> Outage:
        try:
            raw = json.loads(text)
            path = raw.get("path")
            return cls(
                parse_micro_time(raw["start"]),
                parse_duration(raw["duration"]),
                str(raw["class"]),
                path if isinstance(path, dict) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"bad {LAST_OUTAGE} annotation {text!r}: {e}") from e


def renew_patch(
    holder: str,
    now: datetime,
    *,
    clear_released: bool = False,
    clear_previous: bool = False,
    last_outage: Outage | None = None,
) -> dict[str, Any]:
    """The merge patch of one renewal.

    No resourceVersion: a merge patch without one never conflicts with the
    aggregator writing its own fields of the same object.
    """
    patch: dict[str, Any] = {"spec": {"holderIdentity": holder, "renewTime": format_micro_time(now)}}
    annotations: dict[str, str | None] = {}
    if clear_released:
        annotations[RELEASED] = None  # null deletes the key in a merge patch
    if clear_previous:
        annotations[PREVIOUS_RENEW] = None
    if last_outage is not None:
        annotations[LAST_OUTAGE] = last_outage.to_annotation()
    if annotations:
        patch["metadata"] = {"annotations": annotations}
    return patch


def evidence_patch(holder: str, now: datetime) -> list[dict[str, Any]]:
    """A renewal as a JSON patch that keeps the renewTime it overwrites in an annotation.

    The agent's renewals that were sent but never answered may have landed; the answer to
    this one says which landed last, in the same write, with no read right and no read
    that could fall on the other side of the outage. Needs renewTime and the annotations
    map to exist (else KAPI answers 422).
    """
    pointer = "/metadata/annotations/" + PREVIOUS_RENEW.replace("~", "~0").replace("/", "~1")
    return [
        {"op": "copy", "from": "/spec/renewTime", "path": pointer},
        {"op": "add", "path": "/spec/renewTime", "value": format_micro_time(now)},
        {"op": "add", "path": "/spec/holderIdentity", "value": holder},
    ]


def release_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {RELEASED: "true"}}}


def parse_time(text: object) -> datetime | None:
    """A metav1.Time (whole seconds, as creationTimestamp and managedFields carry it); None if absent
    or unreadable."""
    if not isinstance(text, str) or not _TIME.fullmatch(text):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:  # a day or an hour out of range
        return None


# The renew-interval annotation as metadata.managedFields names it.
_RENEW_INTERVAL_FIELD = "f:" + RENEW_INTERVAL


def renewed_after_interval(obj: Mapping[str, Any]) -> bool:
    """Whether the lease's renewTime was last written after its renew-interval annotation.

    Read from ``metadata.managedFields``: the server stamps, per writer, when that writer
    last changed one of its fields (second resolution). The same second, or an entry that
    is missing, is not "after".
    """
    interval_at = renew_at = None
    for entry in (obj.get("metadata") or {}).get("managedFields") or ():
        fields = entry.get("fieldsV1") or {}
        when = parse_time(entry.get("time"))
        if when is None:
            continue
        if _RENEW_INTERVAL_FIELD in ((fields.get("f:metadata") or {}).get("f:annotations") or {}):
            interval_at = when if interval_at is None else max(interval_at, when)
        if "f:renewTime" in (fields.get("f:spec") or {}):
            renew_at = when if renew_at is None else max(renew_at, when)
    return interval_at is not None and renew_at is not None and renew_at > interval_at


def _interval_s(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class LeaseView:
    """A node's Lease as the aggregator acts on it, parsed once where it is listed or watched."""

    # The node's name (the lease's name without the prefix).
    name: str
    renew_time: str | None = None
    # The renew-interval annotation as written (compared as text with what is wanted), and
    # in seconds (None: none, or unreadable).
    interval: str | None = None
    interval_s: float | None = None
    duration_s: int | None = None
    released: bool = False
    owner_uids: tuple[str, ...] = ()
    node_uid: str = ""  # the NODE_UID annotation
    # The server's own record says renewTime was written after renew-interval.
    renewed_after_interval: bool = False
    # Evidence of a renewal that landed unseen (the agent's previous-renew-time annotation,
    # None when absent), and whether the lease has annotations at all to copy it into.
    previous_renew: str | None = None
    annotated: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], *, legacy: bool = False) -> LeaseView:
        """ValueError for an object that is no lease of ours. ``legacy``: a lease of the old
        layout, named like its node."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        annotations = meta.get("annotations") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"lease object without metadata.name: {dict(meta)!r}")
        if not legacy and (name := node_of(name)) is None:
            raise ValueError(f"lease {meta.get('name')!r} is not one of ours (no prefix {LEASE_PREFIX!r})")
        # The server selects by the label already; a lease that only looks like ours by its
        # name must never be judged, rewritten or deleted.
        if not legacy and (meta.get("labels") or {}).get(LEASE_LABEL) != "true":
            raise ValueError(f"lease {meta.get('name')!r} is not one of ours (no label {LEASE_LABEL})")
        duration = spec.get("leaseDurationSeconds")
        interval = annotations.get(RENEW_INTERVAL)
        return cls(
            name=name,
            renew_time=spec.get("renewTime"),
            interval=interval,
            interval_s=_interval_s(interval),
            duration_s=duration if isinstance(duration, int) else None,
            released=annotations.get(RELEASED) == "true",
            owner_uids=tuple(str(r["uid"]) for r in meta.get("ownerReferences") or () if r.get("uid")),
            node_uid=str(annotations.get(NODE_UID) or ""),
            renewed_after_interval=renewed_after_interval(obj),
            previous_renew=None if (previous := annotations.get(PREVIOUS_RENEW)) is None else str(previous),
            annotated=bool(annotations),
        )


def renewal_phase_s(node: str, interval_s: float) -> float:
    """Where in its interval a node renews, spread by a hash of its name: nodes on one interval
    would otherwise all renew in the same second, every interval, once an outage heals or a
    DaemonSet rolls out. Salted, so that it is independent of the hash that picks the fast
    sample (aggregator/act/budget.py)."""
    # Imported here: hashlib's table of OpenSSL digests costs an agent 0.5 MiB, and at an
    # interval under PHASED_FROM_S (the default 2 s among them) this is never called.
    import hashlib  # noqa: PLC0415

    digest = hashlib.sha256(b"renewal-phase:" + node.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * interval_s


# Intervals shorter than this spread over any 10 s window by themselves (the write budget's
# window); aligning them would only delay the first renewal after a recovery.
PHASED_FROM_S = 10.0


def next_renewal_in_s(node: str, interval_s: float, now_wall_s: float) -> float:
    """Seconds from ``now_wall_s`` to the node's next renewal. A slow interval (from 10 s) puts
    it at the node's phase on the wall clock, at least half an interval away: between half and
    one and a half intervals, one on average. Node clocks that disagree only shift the phases;
    the spread stays."""
    if interval_s < PHASED_FROM_S:
        return interval_s
    delay = (renewal_phase_s(node, interval_s) - now_wall_s) % interval_s
    return delay + interval_s if delay < interval_s / 2 else delay


# A node whose lease is not there yet polls, at length, no faster than the shortest slow
# interval: a fresh install of 5000 nodes waits up to 100 s for the aggregator to create 50
# leases a second, and at the renew interval its agents would send 2500 404s a second.
MISSING_MAX_WAIT_S = 60.0


def missing_wait_s(misses: int, interval_s: float, spread: float) -> float:
    """Seconds to wait after the ``misses``-th 404 in a row: from the interval, doubling to
    MISSING_MAX_WAIT_S, times ``spread`` (drawn from [0.5, 1]) so that the agents of a
    fresh install do not poll in step. A lease created a moment late costs a renewal or
    two; one that takes the aggregator minutes costs KAPI a few requests per node."""
    return min(interval_s * 2.0 ** min(max(misses, 1) - 1, 16), MISSING_MAX_WAIT_S) * spread

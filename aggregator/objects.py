"""The API objects the aggregator reads, as typed views, each parsed once where it is read.

Nothing past these views reads a raw object. A node's Lease is ``core.lease.LeaseView``
(the agent's side of the contract lives there too); a dependent's Deployment is the
scaler's ``DependentState``; nodes and Gardener's Clusters are here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.lease import IGNORE_NODE, parse_time

# The well-known label the fast sample is stratified by (aggregator/budget.py).
ZONE_LABEL = "topology.kubernetes.io/zone"

# A node MCM does not manage (dependency-watchdog skips it whatever the value): MCM would not
# replace it, so its silence is no reason to stop MCM.
NOT_MANAGED_BY_MCM = "node.machine.sapcloud.io/not-managed-by-mcm"

# dependency-watchdog's list of conditions that make a node's silence meaningless.
UNHEALTHY_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "DiskPressure", "NetworkUnavailable")


def section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` as a mapping; empty when absent or null (the API omits empty fields)."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return section(obj, "metadata")


def resource_version(obj: Mapping[str, Any]) -> str:
    return str(metadata(obj).get("resourceVersion") or "")


@dataclass(frozen=True)
class NodeView:
    """A Node as a candidate needs it (its metadata, and its conditions when they are read)."""

    name: str
    uid: str = ""
    created: datetime | None = None
    deleting: bool = False
    ignored: bool = False
    unmanaged: bool = False
    unhealthy: bool = False
    zone: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeView:
        meta = metadata(obj)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"node object without metadata.name: {dict(meta)!r}")
        conditions = section(obj, "status").get("conditions") or []
        return cls(
            name=name,
            uid=str(meta.get("uid", "")),
            created=parse_time(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")),
            ignored=section(meta, "annotations").get(IGNORE_NODE) == "true",
            unmanaged=NOT_MANAGED_BY_MCM in section(meta, "annotations"),
            unhealthy=any(
                c.get("type") in UNHEALTHY_CONDITIONS and c.get("status") == "True" for c in conditions
            ),
            zone=str(section(meta, "labels").get(ZONE_LABEL) or ""),
        )


@dataclass(frozen=True)
class ClusterView:
    """A Gardener Cluster: its name, and why it gets no prober ("" when it gets one)."""

    name: str
    skip_reason: str

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterView:
        name = metadata(obj).get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("cluster object without metadata.name")
        return cls(name, _skip_reason(obj))


def _skip_reason(cluster: Mapping[str, Any]) -> str:
    """dependency-watchdog's rules."""
    if metadata(cluster).get("deletionTimestamp"):
        return "deleting"
    shoot = section(section(cluster, "spec"), "shoot")
    spec, status = section(shoot, "spec"), section(shoot, "status")
    if section(spec, "hibernation").get("enabled") or status.get("isHibernated"):
        return "hibernated"
    if not (section(spec, "provider").get("workers") or []):
        return "worker-less"
    last = section(status, "lastOperation")
    if last.get("type") in ("Migrate", "Restore") and last.get("state") != "Succeeded":
        return "migrating"
    if not last or (last.get("type") == "Create" and last.get("state") != "Succeeded"):
        return "not yet reconciled"
    return ""

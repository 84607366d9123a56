"""The API objects the aggregator reads, as typed views, each parsed once where it is read.

Nothing past these views reads a raw object. A node's Lease is ``core.lease.LeaseView``
(the agent's side of the contract lives there too); a dependent's Deployment is the
scaler's ``DependentState``; nodes are here, Gardener's Clusters in lifecycle.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.lease import IGNORE_NODE, parse_time

# The well-known label the fast sample is stratified by (aggregator/act/budget.py).
ZONE_LABEL = "topology.kubernetes.io/zone"

# A node MCM does not manage (dependency-watchdog skips it whatever the value): MCM would not
# replace it, so its silence is no reason to stop MCM.
NOT_MANAGED_BY_MCM = "node.machine.sapcloud.io/not-managed-by-mcm"

# The worker pool a node belongs to: dependency-watchdog's unhealthy conditions are per pool.
WORKER_POOL_LABEL = "worker.gardener.cloud/pool"

# MCM's in-place update marks the node with this condition; with these reasons the node is
# drained for its update or its update failed (dependency-watchdog skips both, whatever the
# condition's status). CandidateForUpdate, SelectedForUpdate and the rest still run workloads.
IN_PLACE_UPDATE = "InPlaceUpdate"
IN_PLACE_UPDATE_REASONS = frozenset({"ReadyForUpdate", "UpdateFailed"})


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
    """A Node as a candidate needs it (its metadata, and its conditions when they are read:
    a node watched as metadata only has none)."""

    name: str
    uid: str = ""
    created: datetime | None = None
    deleting: bool = False
    ignored: bool = False
    unmanaged: bool = False
    zone: str = ""
    pool: str = ""
    # The types of the node's conditions whose status is True.
    true_conditions: frozenset[str] = frozenset()
    in_place_update: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeView:
        meta = metadata(obj)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"node object without metadata.name: {dict(meta)!r}")
        conditions = [c for c in section(obj, "status").get("conditions") or [] if isinstance(c, Mapping)]
        labels = section(meta, "labels")
        return cls(
            name=name,
            uid=str(meta.get("uid", "")),
            created=parse_time(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")),
            ignored=section(meta, "annotations").get(IGNORE_NODE) == "true",
            unmanaged=NOT_MANAGED_BY_MCM in section(meta, "annotations"),
            zone=str(labels.get(ZONE_LABEL) or ""),
            pool=str(labels.get(WORKER_POOL_LABEL) or ""),
            true_conditions=frozenset(str(c.get("type")) for c in conditions if c.get("status") == "True"),
            in_place_update=any(
                c.get("type") == IN_PLACE_UPDATE and c.get("reason") in IN_PLACE_UPDATE_REASONS
                for c in conditions
            ),
        )

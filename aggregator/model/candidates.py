"""dependency-watchdog's node rules that need more than a node's metadata: its unhealthy
conditions per worker pool, its in-place update, its Machine's phase.

Read from dependency-watchdog v1.7.0 (``internal/prober/prober.go`` ``getFilteredNodeNames``,
``internal/util/node.go``) and the machine-controller-manager v0.61 API it builds on. Pure: the
Machines are read by aggregator/observe/machines.py, the conditions arrive with the Node. Each
node is held to them, and to the lease's own rules, in eligibility.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

# MCM's defaults, which dependency-watchdog borrows for any pool without its own list: a node
# with one of them True is one MCM is about to replace, so its silence says nothing of the path.
DEFAULT_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "DiskPressure", "NetworkUnavailable")

# The key of DWD_NODE_CONDITIONS for every pool not listed by name.
EVERY_OTHER_POOL = "*"

# Machines in these phases are on their way out; MCM must be free to replace them.
LEAVING_PHASES = frozenset({"Failed", "Terminating"})
# The label a Machine names its node by (machine-controller-manager).
NODE_LABEL = "node"


@dataclass(frozen=True)
class NodeConditions:
    """Which conditions, True, leave a node of each worker pool out (dependency-watchdog's
    ``map[pool][]condition``; a pool not named gets ``default``). Pools are told apart by the
    node label ``worker.gardener.cloud/pool``."""

    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()
    default: tuple[str, ...] = DEFAULT_CONDITIONS

    def for_pool(self, pool: str) -> tuple[str, ...]:
        for name, conditions in self.pools:
            if name == pool:
                return conditions
        return self.default

    def unhealthy(self, pool: str, true_conditions: Iterable[str]) -> tuple[str, ...]:
        """The pool's conditions among those True on a node, in the pool's order."""
        have = set(true_conditions)
        return tuple(c for c in self.for_pool(pool) if c in have)

    def with_pools(self, pools: Mapping[str, tuple[str, ...]]) -> NodeConditions:
        """These pools' lists replace ours (the shoot's own, from its Cluster, win)."""
        kept = tuple((name, conds) for name, conds in self.pools if name not in pools)
        return NodeConditions(kept + tuple(sorted(pools.items())), self.default)

    @classmethod
    def parse(cls, text: str) -> NodeConditions:
        """``pool: [Condition, ...]`` per pool as YAML or JSON, ``"*"`` for every other pool.
        An empty list means that pool's nodes are never left out for a condition. ValueError
        says what is wrong."""
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"not YAML: {e}") from e
        if not isinstance(raw, dict):
            raise ValueError("expected a mapping of worker pool to a list of condition types")
        pools: dict[str, tuple[str, ...]] = {}
        for pool, conditions in raw.items():
            if not isinstance(pool, str) or not pool:
                raise ValueError(f"{pool!r} is not a worker pool name")
            if not isinstance(conditions, list) or not all(
                isinstance(c, str) and c.strip() for c in conditions
            ):
                raise ValueError(f"pool {pool!r}: expected a list of condition types, got {conditions!r}")
            pools[pool] = tuple(c.strip() for c in conditions)
        default = pools.pop(EVERY_OTHER_POOL, DEFAULT_CONDITIONS)
        return cls(tuple(sorted(pools.items())), default)


def pools_of_workers(workers: object) -> dict[str, tuple[str, ...]]:
    """A shoot's own lists, as dependency-watchdog reads them from ``spec.provider.workers``:
    a pool with ``machineControllerManager`` set gets its ``nodeConditions``, or the default
    when that is empty (Gardener omits an empty list); other pools are not named."""
    out: dict[str, tuple[str, ...]] = {}
    for worker in workers if isinstance(workers, list) else ():
        if not isinstance(worker, dict) or not isinstance(worker.get("name"), str):
            continue
        mcm: Any = worker.get("machineControllerManager")
        if not isinstance(mcm, dict):
            continue
        listed = mcm.get("nodeConditions")
        conditions = tuple(str(c) for c in listed) if isinstance(listed, list) else ()
        out[worker["name"]] = conditions or DEFAULT_CONDITIONS
    return out


def machine_reason(phase: str | None) -> str | None:
    """Why a node whose Machine is in ``phase`` is left out (None: it is not)."""
    return f"machine {phase}" if phase in LEAVING_PHASES else None


def phases_by_node(items: object) -> dict[str, str]:
    """Each node's Machine phase. A node with several Machines (a replacement under way) takes
    one that is not leaving, if any: DWD keeps a node that has any such Machine."""
    out: dict[str, str] = {}
    for obj in items if isinstance(items, list) else ():
        if not isinstance(obj, Mapping):
            continue
        node = _at(obj, "metadata", "labels").get(NODE_LABEL)
        if not isinstance(node, str) or not node:
            continue  # not joined yet: no node to leave out
        phase = str(_at(obj, "status", "currentStatus").get("phase") or "")
        if out.get(node, "Failed") in LEAVING_PHASES:
            out[node] = phase
    return out


def _at(obj: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    """The mapping at ``obj[k1][k2]...``; empty where a level is absent or not a mapping (the
    same reading as aggregator.model.objects.section, which imports this module)."""
    for key in keys:
        value = obj.get(key)
        obj = value if isinstance(value, Mapping) else {}
    return obj

"""Which shoots get a target, from the Shoot gardenlet embeds in each Cluster: dependency-watchdog's
rules (v1.7.0, ``controllers/cluster/cluster_controller.go``), on the fields' wire names.

Two questions, as dependency-watchdog asks them of its probers:
- ``stop``: a running target stops (and hands back what it holds: its owner decides the
  controllers now). The Shoot is being deleted, hibernation is enabled, its control plane is
  migrating (a ``Migrate`` operation in any state), or it has no worker pool.
- ``no_start``: no new target starts. The Shoot is waking up from hibernation (its control
  plane is still coming up), has no ``lastOperation`` yet, or its last operation is neither a
  ``Reconcile`` (in any state) nor a ``Create`` or ``Restore`` that succeeded. A target that runs
  already keeps running through such a state.

One deliberate difference, in docs/decision.md: a Cluster whose own ``metadata.deletionTimestamp``
is set stops its target too (dependency-watchdog reads only the Shoot's; gardenlet deletes the
Cluster last, so the two agree in Gardener).

Pure: tests/unit/test_layers.py keeps it free of I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggregator.model.candidates import pools_of_workers
from aggregator.model.objects import metadata, section

# Gardener's confirmation (v1beta1constants.AnnotationConfirmationForceDeletion), read as its
# ShootNeedsForceDeletion reads it: Go's strconv.ParseBool, anything else false.
FORCE_DELETION = "confirmation.gardener.cloud/force-deletion"
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


def go_bool(value: object) -> bool:
    """``value`` as Go's ``strconv.ParseBool`` reads it, its error read as false."""
    return isinstance(value, str) and value in _GO_TRUE


@dataclass(frozen=True)
class ClusterView:
    """A Gardener Cluster as the targets' source reads it: its name (the shoot's control-plane
    namespace), its lifecycle, and its worker pools' own unhealthy conditions
    (dependency-watchdog reads them from here too)."""

    name: str
    lifecycle: Lifecycle
    node_conditions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The Shoot confirmed for force deletion: its Extension's deletion waits on nothing in it.
    force_deletion: bool = False
    # The Shoot's last operation failed (Gardener's ``IsFailed``): its extensions leave it alone.
    failed: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterView:
        name = metadata(obj).get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("cluster object without metadata.name")
        shoot_spec = section(section(section(obj, "spec"), "shoot"), "spec")
        pools = pools_of_workers(section(shoot_spec, "provider").get("workers"))
        shoot_meta = metadata(section(section(obj, "spec"), "shoot"))
        force = (shoot_meta.get("annotations") or {}).get(FORCE_DELETION)
        last = section(section(section(section(obj, "spec"), "shoot"), "status"), "lastOperation")
        failed = last.get("state") == "Failed"
        return cls(name, Lifecycle.of(obj), tuple(sorted(pools.items())), go_bool(force), failed)


@dataclass(frozen=True)
class Lifecycle:
    """Why a running target stops, and why a new one does not start ("" for neither)."""

    stop: str = ""
    no_start: str = ""

    def serves(self, running: bool) -> bool:
        """Whether the shoot has a target now, given whether it has one already."""
        return not self.stop and (running or not self.no_start)

    def reason(self, running: bool) -> str:
        """Why it has none ("" when it has one)."""
        return "" if self.serves(running) else self.stop or self.no_start

    @classmethod
    def of(cls, cluster: Mapping[str, Any]) -> Lifecycle:
        shoot = section(section(cluster, "spec"), "shoot")
        return cls(_stop(cluster, shoot), _no_start(shoot))


def _stop(cluster: Mapping[str, Any], shoot: Mapping[str, Any]) -> str:
    spec, status = section(shoot, "spec"), section(shoot, "status")
    if metadata(shoot).get("deletionTimestamp") or metadata(cluster).get("deletionTimestamp"):
        return "deleting"
    if section(spec, "hibernation").get("enabled") is True:
        return "hibernated"
    if section(status, "lastOperation").get("type") == "Migrate":
        return "migrating"
    if not (section(spec, "provider").get("workers") or []):
        return "worker-less"
    return ""


def _no_start(shoot: Mapping[str, Any]) -> str:
    spec, status = section(shoot, "spec"), section(shoot, "status")
    if section(spec, "hibernation").get("enabled") is not True and status.get("hibernated") is True:
        return "waking up"
    last = status.get("lastOperation")
    if not isinstance(last, Mapping):
        return "not yet created"
    kind, state = last.get("type"), last.get("state")
    if kind == "Reconcile" or (kind in ("Create", "Restore") and state == "Succeeded"):
        return ""
    named = {
        "Create": "being created",
        "Restore": "being restored",
        "Delete": "being deleted",
        "Migrate": "migrating",
    }
    return named.get(str(kind), f"last operation {kind or '(none)'}")

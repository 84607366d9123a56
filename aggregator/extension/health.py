"""What the Extension tells gardenlet of its shoot's protection, and the heartbeat that says the
controller is alive.

gardenlet's shoot care merges each Extension's ``SystemComponentsHealthy`` condition into the
Shoot's own (``pkg/gardenlet/controller/shoot/care/health.go``, judged by
``checker.CheckExtensionCondition``): False or Unknown makes the Shoot's condition fail with our
message, Progressing passes through, True leaves it to gardenlet's other checks, and a condition
whose controller's heartbeat Lease (``gardener-extension-heartbeat`` in the controller's
namespace) is older than its threshold reads as outdated. With ``autoEnable`` every shoot of a
landscape carries it, so the contract (docs/design.md, "The condition contract") is that only a
broken protection of a shoot that needs one is False: no view of the shoot, a target that
failed, a providerConfig that was never valid. A shoot too small to judge, one in dry run, one
its owner opted out, a hibernated one and one without workers are True and say so. Starting to
judge (a start, a new leader, a view waiting out its first lease duration) says nothing: what
was said stands, so a restart changes no Shoot's condition.

Pure: the reconciler writes what these return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from aggregator.extension.contract import CONDITION
from aggregator.model.verdict import Phase

HEARTBEAT = "gardener-extension-heartbeat"
HELD_DOWN = "dwd-lease holds the shoot's controllers down: a quorum of its nodes cannot reach the API server"
RESTORING = "dwd-lease is restoring the shoot's controllers: its nodes reach the API server again"
DRY_RUN = "dwd-lease judges the nodes' agents in a dry run: it scales nothing"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
# The source's reasons for an Extension it does not serve (aggregator/extension/source.py).
DISABLED = "its providerConfig says disabled"
INVALID = "its providerConfig is invalid"
WAITING = "its Extension waits for its state (wait-for-state)"


class Judged(Protocol):
    """What a target reports of its last verdict (aggregator/report.py ``TargetStatus``)."""

    @property
    def phase(self) -> Phase: ...
    @property
    def judging(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def view(self) -> str: ...
    @property
    def view_opening(self) -> bool: ...


@dataclass(frozen=True)
class Health:
    status: str  # True, False, Progressing
    reason: str
    message: str

    def condition(self, now: str, before: dict[str, Any] | None) -> dict[str, Any]:
        """The condition as Gardener writes one: its transition time kept while the status is."""
        same = before is not None and before.get("status") == self.status
        return {
            "type": CONDITION,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastUpdateTime": now,
            "lastTransitionTime": str(before.get("lastTransitionTime")) if same and before else now,
        }

    def said_by(self, condition: dict[str, Any] | None) -> bool:
        return condition is not None and (
            condition.get("status"),
            condition.get("reason"),
            condition.get("message"),
        ) == (
            self.status,
            self.reason,
            self.message,
        )


def health(status: Judged | None, error: str, *, dry_run: bool = False) -> Health | None:
    """A served shoot's protection from its target's ``status`` (None: not started yet), the
    error its last life ended with ("" for none) and whether it runs dry: None while it starts
    to judge (nothing new to say)."""
    if error:
        return Health("False", "ProtectionOff", f"dwd-lease cannot protect this shoot: {error}")
    # A view waiting out its first lease duration is no lack of one: a leader's start would
    # otherwise turn every shoot's condition False, or Progressing, for that long.
    if status is None or status.phase is Phase.STARTING or (status.view and status.view_opening):
        return None
    if status.view:
        return Health("False", "ProtectionOff", f"dwd-lease has no trusted view of the shoot: {status.view}")
    if dry_run:
        return Health("True", "DryRun", DRY_RUN)
    if not status.judging:
        return Health("True", "QuorumNotJudged", f"dwd-lease has no quorum to judge: {status.reason}")
    # Protection doing its work, said in the Shoot's status so that nobody wonders why its
    # controllers are at 0. Fixed texts: the verdict's own words change every tick.
    if status.phase is Phase.DOWN:
        return Health("True", "ControllersHeldDown", HELD_DOWN)
    if status.phase is Phase.RECOVERING:
        return Health("True", "ControllersRestoring", RESTORING)
    return Health("True", "ProtectionActive", "dwd-lease judges the nodes' agents and protects the shoot")


def unserved(skipped: str, why: str) -> Health | None:
    """The protection of a shoot whose Extension stays while nothing serves it: ``skipped``, why
    its Cluster's lifecycle leaves it to gardenlet, ``why`` our own reason (the source's). None
    where it is between states (created, waking up, deleted, migrated): nothing new to say."""
    if skipped == "hibernated":
        return Health("True", "ShootHibernated", "Shoot is hibernated")
    if skipped == "worker-less":
        return Health("True", "NoWorkers", "the shoot has no worker nodes: nothing for dwd-lease to protect")
    if why == DISABLED:
        return Health("True", "ProtectionDisabled", "dwd-lease is turned off by the shoot's providerConfig")
    if why.startswith(INVALID):
        return Health("False", "ConfigurationInvalid", f"dwd-lease cannot protect this shoot: {why}")
    return None


def heartbeat(namespace: str, holder: str, renew_s: int, now: str) -> dict[str, Any]:
    """The heartbeat Lease as Gardener's heartbeat controller writes it: held by the extension's
    name, its duration the renew interval, renewed now (MicroTime)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": HEARTBEAT, "namespace": namespace},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": renew_s, "renewTime": now},
    }

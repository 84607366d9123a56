"""Gardener's Extension contract, as gardenlet and Gardener's controller library state it
(gardener/gardener ``extensions/pkg/controller/extension/reconciler.go``,
``pkg/utils/kubernetes/health/extensions.go``): the Extension read into a view, what it asks of
its controller now, and the status bodies that answer.

gardenlet creates one Extension of our type in each shoot's control-plane namespace, annotated
``gardener.cloud/operation: reconcile`` (and ``gardener.cloud/timestamp``) whenever it wants a
reconcile; it counts the Extension ready when the annotation is gone, ``observedGeneration``
is the generation, ``lastOperation`` is Succeeded and not older than the timestamp, and there
is no ``lastError``. The controller holds its finalizer on every Extension it serves and drops
it only once the deletion is done.

Pure: data in, data out; the reconciler (aggregator/extension/reconciler.py) does the writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aggregator.model.objects import metadata, section

EXTENSIONS = "/apis/extensions.gardener.cloud/v1alpha1/extensions"
OPERATION = "gardener.cloud/operation"
TIMESTAMP = "gardener.cloud/timestamp"
# The condition gardenlet merges into the Shoot's (aggregator/extension/health.py).
CONDITION = "SystemComponentsHealthy"
# Gardener's library names its finalizer after the controller: extensions.gardener.cloud/<name>.
FINALIZER = "extensions.gardener.cloud/dwd-lease"


@dataclass(frozen=True)
class ExtensionView:
    """One Extension as the controller reads it."""

    namespace: str
    name: str
    type: str
    generation: int
    resource_version: str
    deleting: bool
    finalizers: tuple[str, ...]
    operation: str
    # gardenlet's ``gardener.cloud/timestamp``: a new one is a new request ("" where absent).
    timestamp: str
    observed_generation: int | None
    last_operation: tuple[str, str, str]  # type, state, description ("" where absent)
    last_error: str
    provider_config: Any = field(default=None, hash=False)
    # Our condition as last written (aggregator/extension/health.py), None before the first.
    health: Any = field(default=None, hash=False)

    @property
    def asked(self) -> tuple[int, str]:
        """What gardenlet asked for last: a new generation or timestamp is a new request."""
        return self.generation, self.timestamp

    @property
    def path(self) -> str:
        return f"{EXTENSIONS.rsplit('/', 1)[0]}/namespaces/{self.namespace}/extensions/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ExtensionView:
        meta, spec, status = metadata(obj), section(obj, "spec"), section(obj, "status")
        if not meta.get("namespace") or not meta.get("name"):
            raise ValueError("extension without metadata.namespace or metadata.name")
        last = section(status, "lastOperation")
        observed = status.get("observedGeneration")
        return cls(
            namespace=str(meta["namespace"]),
            name=str(meta["name"]),
            type=str(spec.get("type") or ""),
            generation=int(meta.get("generation") or 0),
            resource_version=str(meta.get("resourceVersion") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
            operation=str((meta.get("annotations") or {}).get(OPERATION) or ""),
            timestamp=str((meta.get("annotations") or {}).get(TIMESTAMP) or ""),
            observed_generation=None if observed is None else int(observed),
            last_operation=(
                str(last.get("type") or ""),
                str(last.get("state") or ""),
                str(last.get("description") or ""),
            ),
            last_error=str(section(status, "lastError").get("description") or ""),
            provider_config=spec.get("providerConfig"),
            health=next(
                (
                    c
                    for c in status.get("conditions") or ()
                    if isinstance(c, dict) and c.get("type") == CONDITION
                ),
                None,
            ),
        )


@dataclass(frozen=True)
class Outcome:
    """What a finished operation says: Succeeded, or Error with the problems as its lastError
    and the error codes gardenlet classifies them by."""

    kind: str  # Create, Reconcile, Restore, Delete or Migrate
    problems: tuple[str, ...] = ()
    codes: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        return "Error" if self.problems else "Succeeded"

    @property
    def description(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        return DONE.get(self.kind, "protection configured")


DONE = {"Delete": "marks handed back", "Migrate": "shoot part left to the next seed"}
# gardenlet reads this code as the owner's error, not the landscape's (a providerConfig to fix).
CONFIGURATION_PROBLEM = "ERR_CONFIGURATION_PROBLEM"
# A restore on a new seed before gardenlet has copied the state in: Gardener's library leaves
# the Extension alone altogether.
WAIT_FOR_STATE = "wait-for-state"


def operation_type(view: ExtensionView) -> str:
    """The operation the Extension asks for, as Gardener computes it
    (``v1beta1helper.ComputeOperationType``): the annotation or the deletion first, then an
    operation that did not succeed goes on as what it was, and one that never was is a Create."""
    kind, state, _ = view.last_operation
    if view.operation == "migrate":
        return "Migrate"
    if view.deleting:
        return "Delete"
    if view.operation == "restore":
        return "Restore"
    if not kind:
        return "Create"
    if kind in ("Create", "Migrate", "Restore") and state != "Succeeded":
        return kind
    return "Reconcile"


def wants_reconcile(view: ExtensionView, *, first_look: bool) -> bool:
    """Whether the Extension asks for a reconcile now, as the library's ``DefaultPredicates``
    admit one: gardenlet's annotation, or at the controller's first look (a start, a new
    leader) an operation that did not succeed. A new generation, a status that no longer says
    what the seed's settings make of the spec, our finalizer gone: none of these, on their own,
    is gardenlet asking (it annotates every spec change it makes)."""
    asked = view.operation in ("reconcile", "restore")
    return asked or (first_look and view.last_operation[1] != "Succeeded")


def claim(view: ExtensionView) -> dict[str, Any]:
    """The metadata patch that takes an operation on: our finalizer on, the ``reconcile``
    annotation off (a ``restore`` stays until the restore has succeeded, as the library keeps
    it), conditional on the resourceVersion read (the finalizers are a list: a merge patch
    replaces it whole, so it must be the list as it is now)."""
    finalizers = list(view.finalizers) if FINALIZER in view.finalizers else [*view.finalizers, FINALIZER]
    body: dict[str, Any] = {"resourceVersion": view.resource_version, "finalizers": finalizers}
    if view.operation == "reconcile":
        body["annotations"] = {OPERATION: None}
    return {"metadata": body}


def restored(view: ExtensionView) -> dict[str, Any]:
    """The metadata patch that answers a ``restore`` once it has succeeded."""
    return {"metadata": {"resourceVersion": view.resource_version, "annotations": {OPERATION: None}}}


def release(view: ExtensionView, *, every: bool = False) -> dict[str, Any]:
    """The metadata patch that drops our finalizer (``every`` one, as a migration does, with its
    ``migrate`` annotation answered), conditional on the resourceVersion read."""
    rest = [] if every else [f for f in view.finalizers if f != FINALIZER]
    body: dict[str, Any] = {"resourceVersion": view.resource_version, "finalizers": rest}
    if view.operation == "migrate":
        body["annotations"] = {OPERATION: None}
    return {"metadata": body}


# The library's progress: 1 when an operation begins, 50 when it failed, 100 when it succeeded.
PROGRESS = {"Processing": 1, "Error": 50, "Succeeded": 100}


def processing(kind: str, now: str) -> dict[str, Any]:
    """The status body of an operation begun."""
    return {"status": {"lastOperation": _last(kind, "Processing", f"{kind} in progress", now)}}


def finished(view: ExtensionView, outcome: Outcome, now: str) -> dict[str, Any]:
    """The status body of an operation finished: its lastOperation, its lastError (or none), and
    the generation it answers."""
    error: dict[str, Any] | None = None
    if outcome.problems:
        error = {"description": outcome.description, "lastUpdateTime": now}
        if outcome.codes:
            error["codes"] = list(outcome.codes)
    return {
        "status": {
            "lastOperation": _last(outcome.kind, outcome.state, outcome.description, now),
            "lastError": error,
            "observedGeneration": view.generation,
        }
    }


def _last(kind: str, state: str, description: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "state": state,
        "description": description,
        "lastUpdateTime": now,
        "progress": PROGRESS[state],
    }

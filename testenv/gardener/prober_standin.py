"""A stand-in of gardener/dependency-watchdog v1.7.0's prober, for tests that run "what the real DWD
does" beside the aggregator against real kube-apiservers.

Written from a reading of DWD v1.7.0 (``internal/prober/prober.go``, ``internal/prober/scaler/``
``scale.go``, ``scaler.go``, ``flow.go``, ``util.go``, ``scaleroptions.go``, ``internal/util/``,
``internal/prober/config.go``, ``controllers/cluster/cluster_controller.go``) and of what it does when
run for real beside the aggregator (docs/install.md). Its own Python, not a translation.

One probe (``ProberStandIn.probe_once``), as ``Prober.probe`` reads:

1. wait out a throttling back-off (10 s after any 429 from the shoot);
2. shoot ``GET /version``; a failure skips the probe;
3. LIST the shoot's Nodes; keep the candidates: managed by MCM (no annotation
   ``node.machine.sapcloud.io/not-managed-by-mcm``, whatever its value), healthy by conditions
   (none of KernelDeadlock, ReadonlyFilesystem, DiskPressure, NetworkUnavailable True, or the
   worker pool's own list), a Machine not Failed/Terminating (see below), not in an in-place update
   (condition InPlaceUpdate with reason ReadyForUpdate or UpdateFailed);
4. LIST ``kube-node-lease`` Leases; the candidates' leases (same name) are judged: expired when
   ``now >= renewTime + 0.75 x kcmNodeMonitorGraceDuration`` (``leaseDurationSeconds`` ignored);
5. exactly one candidate: no scaling; none: the scale-up flow; expired/candidates below
   ``nodeLeaseFailureFraction``: the scale-up flow, else the scale-down flow.

A flow runs the dependents level by level (ascending; a level waits for every earlier level), the
dependents of one level in parallel threads. A failed dependent (after 3 attempts 100 ms apart)
lets its level finish and stops the flow there; the next probe starts over. Per dependent and
attempt: sleep the step's ``initialDelay``; read its annotations (NotFound and optional: done);
``ignore-scaling`` true (Go's ``strconv.ParseBool``): remove a ``meltdown-protection-active`` if
present, done; read the scale subresource. Scale-up only at ``spec.replicas == 0`` (otherwise a
leftover ``meltdown-protection-active`` is removed); scale-down only at ``spec.replicas > 0``.
Scale-down merge-patches ``replicas`` = the current replicas and ``meltdown-protection-active`` =
"" onto the object, then sets the scale to 0. Scale-up sets the scale to the ``replicas``
annotation (1 if missing; not an integer: an error), then removes ``meltdown-protection-active``
only (unconditionally, present or not): **``replicas`` stays for ever**. The scale is set as
client-go's ``ScaleInterface.Update`` sets it: a PUT of the Scale just read, so a concurrent change
makes it 409 and the attempt is retried. Then it polls ``status.readyReplicas`` every second (up:
>= 1, down: == 0) for 5 s; a timeout fails the attempt, and the next attempt (after the initial
delay again) finds the replicas already set and succeeds, so a slow rollout delays a flow but does
not stop it.

The loop (``start``): sleep the initial delay, then probe, then wait ``interval x (1 + jitter x
rand)`` after each probe ends (``wait.JitterUntil``, sliding), until ``stop``.

Where the stand-in differs from DWD:

- Shoot selection: it probes the shoot it is given. DWD starts a prober per ``Cluster`` and stops
  it when the shoot is hibernated, deleted, migrated or worker-less, or not yet reconciled; it reads
  ``nodeMonitorGracePeriod`` and the pools' node conditions from the Cluster (pass
  ``kcm_grace_s`` and ``worker_node_conditions`` instead).
- Shoot access: a ``Client`` instead of the kubeconfig Secret DWD re-reads on every probe.
  Keep-alive is off as in DWD (each shoot request sends ``Connection: close``); the shoot requests
  are bounded by ``probe_timeout_s`` as DWD's by ``probeTimeout``. DWD's controller-runtime client
  also does API discovery against the shoot; the stand-in does not.
- Machines: skipped unless ``check_machines`` (the test seeds have no Machine CRD): then every node
  counts as having a Machine that is neither Failed nor Terminating. DWD always lists Machines in the
  seed; without the CRD every probe fails there and it never scales; a node without a Machine
  (label ``node=<name>``) is no candidate.
- Reads: DWD reads a dependent's annotations (a PartialObjectMetadata GET) and the Machines from its
  informer cache, which may lag the server by a watch event; the stand-in GETs the object. The
  ``readyReplicas`` read is uncached in both. DWD's seed client is rate-limited (QPS 5, burst 10);
  the stand-in's is not. DWD bounds the scale GET and update by the step's ``timeout`` (30 s
  default); the stand-in leaves every seed request to the seed ``Client``'s timeout.
- Resource mapping: DWD resolves a ref's resource through discovery; the stand-in lowercases the
  kind and appends "s" (Deployment -> deployments, StatefulSet -> statefulsets).
- Clock: one ``now`` per probe; DWD reads the clock per lease.
- A candidate lease without ``renewTime`` makes DWD panic and exit (and its Deployment restart
  it); the stand-in raises ``ProberPanic`` from ``probe_once`` and its loop ends, not restarted.
- No leader election, no logs. What it did is kept in ``probes`` and ``writes`` instead.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx

from core.durations import parse_duration
from core.errors import ConfigError, KubeError, NotFound, TooManyRequests, api_error
from core.lease import leases_path, parse_micro_time
from testenv.base.kapi import Client

PREFIX = "dependency-watchdog.gardener.cloud/"
REPLICAS = PREFIX + "replicas"
IGNORE_SCALING = PREFIX + "ignore-scaling"
MELTDOWN = PREFIX + "meltdown-protection-active"
NOT_MANAGED_BY_MCM = "node.machine.sapcloud.io/not-managed-by-mcm"
WORKER_POOL_LABEL = "worker.gardener.cloud/pool"
NODE_LEASE_NAMESPACE = "kube-node-lease"
MACHINES = "/apis/machine.sapcloud.io/v1alpha1/namespaces/{ns}/machines"

# MCM's defaults, which DWD borrows (internal/util/node.go).
DEFAULT_UNHEALTHY_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "DiskPressure", "NetworkUnavailable")
IN_PLACE_UPDATE = "InPlaceUpdate"
IN_PLACE_UPDATE_REASONS = frozenset({"ReadyForUpdate", "UpdateFailed"})
FAILED_MACHINE_PHASES = frozenset({"Failed", "Terminating"})

# prober.go: a lease counts as expired at three quarters of KCM's grace, so DWD acts before KCM.
EXPIRY_BUFFER_FRACTION = 0.75
THROTTLE_BACKOFF_S = 10.0  # prober.go, backOffDurationForThrottledRequests
SCALE_ATTEMPTS = 3  # flow.go, defaultMaxResourceScalingAttempts
SCALE_RETRY_BACKOFF_S = 0.1  # scaleroptions.go, defaultScaleResourceBackoff
DEFAULT_SCALE_TIMEOUT_S = 30.0  # config.go, DefaultScaleUpdateTimeout
DEFAULT_SCALE_INITIAL_DELAY_S = 0.0  # config.go, DefaultScaleInitialDelay

# Gardener's dependents (gardener pkg/component/.../NewDependencyWatchdogProberConfiguration):
# scale-down stops MCM and CA first, then KCM; scale-up starts KCM, MCM 30 s later, then CA.
GARDENER_DEPENDENTS: dict[str, Any] = {
    "dependentResourceInfos": [
        {
            "ref": {"kind": "Deployment", "name": "kube-controller-manager", "apiVersion": "apps/v1"},
            "optional": False,
            "scaleUp": {"level": 0},
            "scaleDown": {"level": 1},
        },
        {
            "ref": {"kind": "Deployment", "name": "machine-controller-manager", "apiVersion": "apps/v1"},
            "optional": False,
            "scaleUp": {"level": 1, "initialDelay": "30s"},
            "scaleDown": {"level": 0},
        },
        {
            "ref": {"kind": "Deployment", "name": "cluster-autoscaler", "apiVersion": "apps/v1"},
            "optional": True,
            "scaleUp": {"level": 2},
            "scaleDown": {"level": 0},
        },
    ]
}

Operation = Literal["scale-up", "scale-down"]
Action = Literal["no-scaling", "scale-up", "scale-down"]
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_ATOI = re.compile(r"^[+-]?\d+$")  # Go's strconv.Atoi

_FLOW_KEYS: tuple[tuple[Operation, str], ...] = (("scale-up", "scaleUp"), ("scale-down", "scaleDown"))
# What a request to an API server may raise (testenv's Client does not wrap httpx's errors).
_Failure = (KubeError, httpx.HTTPError, OSError)


class ProberPanic(Exception):
    """What makes DWD v1.7.0 panic and exit: a candidate lease without renewTime."""


class ScaleError(Exception):
    """A dependent could not be scaled (bad annotation, readiness not reached in time)."""


class _Stopped(Exception):
    pass


class _Skipped(Exception):
    pass


# --- the dependents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    api_version: str
    kind: str
    name: str

    def object_path(self, namespace: str) -> str:
        group_version = self.api_version
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        return f"{base}/namespaces/{namespace}/{self.kind.lower()}s/{self.name}"


@dataclass(frozen=True)
class Step:
    """One dependent in one flow."""

    ref: Ref
    optional: bool
    level: int
    initial_delay_s: float
    timeout_s: float


def scale_flows(config: Mapping[str, Any]) -> dict[Operation, list[list[Step]]]:
    """The scale-up and scale-down flows of a prober config, as levels in the order they run.

    ``config`` has DWD's shape (``dependentResourceInfos``); durations are Go strings, missing
    ``initialDelay`` is 0 s and missing ``timeout`` 30 s (config.go). Every problem is reported at once.
    """
    problems: list[str] = []
    steps: dict[Operation, list[Step]] = {"scale-up": [], "scale-down": []}
    infos = config.get("dependentResourceInfos") or []
    if not infos:
        problems.append("dependentResourceInfos: none given")
    for i, info in enumerate(infos):
        where = f"dependentResourceInfos[{i}]"
        ref = info.get("ref") or {}
        missing = [k for k in ("apiVersion", "kind", "name") if not ref.get(k)]
        if missing:
            problems.append(f"{where}.ref: missing {', '.join(missing)}")
            continue
        r = Ref(str(ref["apiVersion"]), str(ref["kind"]), str(ref["name"]))
        for op, key in _FLOW_KEYS:
            scale = info.get(key)
            if scale is None:
                problems.append(f"{where}.{key}: missing")
                continue
            try:
                step = Step(
                    r,
                    bool(info.get("optional", False)),
                    int(scale.get("level", 0)),
                    _duration(scale.get("initialDelay"), DEFAULT_SCALE_INITIAL_DELAY_S),
                    _duration(scale.get("timeout"), DEFAULT_SCALE_TIMEOUT_S),
                )
            except (TypeError, ValueError) as e:
                problems.append(f"{where}.{key}: {e}")
                continue
            steps[op].append(step)
    if problems:
        raise ConfigError(problems)
    return {op: _by_level(s) for op, s in steps.items()}


def _duration(value: Any, default: float) -> float:
    return default if value is None else parse_duration(str(value))


def _by_level(steps: list[Step]) -> list[list[Step]]:
    levels = sorted({s.level for s in steps})
    return [[s for s in steps if s.level == level] for level in levels]


# --- the judgement: pure functions of what was read and now --------------------------------------


@dataclass(frozen=True)
class NodeVerdict:
    """Why a node is, or is not, a candidate (DWD logs the same named booleans)."""

    name: str
    managed_by_mcm: bool
    healthy: bool
    machine_ok: bool
    in_place_update: bool

    @property
    def candidate(self) -> bool:
        return self.managed_by_mcm and self.healthy and self.machine_ok and not self.in_place_update


def judge_nodes(
    nodes: Sequence[Mapping[str, Any]],
    machines: Sequence[Mapping[str, Any]] | None = None,
    worker_node_conditions: Mapping[str, Sequence[str]] | None = None,
) -> list[NodeVerdict]:
    """Each node's verdict. ``machines`` None: the Machine check is skipped (every node passes)."""
    pools = worker_node_conditions or {}
    verdicts = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        conditions = (node.get("status") or {}).get("conditions") or []
        pool = str((meta.get("labels") or {}).get(WORKER_POOL_LABEL, ""))
        unhealthy = pools.get(pool, DEFAULT_UNHEALTHY_CONDITIONS)
        verdicts.append(
            NodeVerdict(
                name=name,
                managed_by_mcm=NOT_MANAGED_BY_MCM not in (meta.get("annotations") or {}),
                healthy=not any(c.get("type") in unhealthy and c.get("status") == "True" for c in conditions),
                machine_ok=machines is None or _has_working_machine(name, machines),
                in_place_update=any(
                    c.get("type") == IN_PLACE_UPDATE and c.get("reason") in IN_PLACE_UPDATE_REASONS
                    for c in conditions
                ),
            )
        )
    return verdicts


def _has_working_machine(node: str, machines: Sequence[Mapping[str, Any]]) -> bool:
    for m in machines:
        labels = (m.get("metadata") or {}).get("labels") or {}
        phase = ((m.get("status") or {}).get("currentStatus") or {}).get("phase")
        if labels.get("node") == node and phase not in FAILED_MACHINE_PHASES:
            return True
    return False


def candidate_leases(
    leases: Sequence[Mapping[str, Any]], verdicts: Sequence[NodeVerdict]
) -> list[Mapping[str, Any]]:
    """The leases named like a candidate node, in list order; nodes without a lease are left out."""
    names = {v.name for v in verdicts if v.candidate}
    return [lease for lease in leases if (lease.get("metadata") or {}).get("name") in names]


@dataclass(frozen=True)
class Verdict:
    action: Action
    candidates: int
    expired: int


def judge_leases(
    candidates: Sequence[Mapping[str, Any]], now: datetime, grace_s: float, failure_fraction: float
) -> Verdict:
    """What DWD does with these candidate leases at ``now`` (``grace_s``: KCM's node monitor grace)."""
    if len(candidates) == 1:
        return Verdict("no-scaling", 1, 0)  # renewTime is not even looked at
    if not candidates:
        return Verdict("scale-up", 0, 0)
    expire_after = timedelta(seconds=grace_s * EXPIRY_BUFFER_FRACTION)
    expired = 0
    for lease in candidates:
        renew = (lease.get("spec") or {}).get("renewTime")
        if not renew:
            name = (lease.get("metadata") or {}).get("name")
            raise ProberPanic(f"candidate lease {name} has no renewTime (DWD v1.7.0 dereferences nil)")
        if now >= parse_micro_time(str(renew)) + expire_after:
            expired += 1
    action: Action = "scale-up" if expired / len(candidates) < failure_fraction else "scale-down"
    return Verdict(action, len(candidates), expired)


def target_replicas(annotations: Mapping[str, str]) -> int:
    """Scale-up's target: the ``replicas`` annotation, or 1 without one."""
    text = annotations.get(REPLICAS)
    if text is None:
        return 1
    if not _ATOI.match(text):
        raise ScaleError(f"invalid {REPLICAS} annotation {text!r}")
    return int(text)


def ignores_scaling(annotations: Mapping[str, str]) -> bool:
    return annotations.get(IGNORE_SCALING) in _TRUE


# --- the record -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """A write the stand-in made, once the server accepted it."""

    method: str
    path: str
    body: dict[str, Any]
    t: float  # time.monotonic() when it was sent
    name: str  # the dependent


@dataclass(frozen=True)
class Probe:
    started: float  # time.monotonic()
    ended: float
    decision: str
    verdict: Verdict | None = None
    errors: tuple[str, ...] = ()


# --- the prober -------------------------------------------------------------------------------


@dataclass
class ProberStandIn:
    """A stand-in of DWD's prober for one shoot (the real program is
    ``testenv.gardener.dependency_watchdog.DependencyWatchdog``): ``probe_once`` without a thread,
    ``start``/``stop`` for the loop.

    The caller owns both clients (they are not closed here). Defaults are Gardener's settings;
    DWD's own default probe interval is 10 s.
    """

    shoot: Client
    seed: Client
    namespace: str
    dependents: Mapping[str, Any] = field(default_factory=lambda: GARDENER_DEPENDENTS)
    probe_interval_s: float = 30.0
    jitter: float = 0.2
    initial_delay_s: float = 30.0
    probe_timeout_s: float = 30.0
    kcm_grace_s: float = 40.0
    failure_fraction: float = 0.6
    ready_timeout_s: float = 5.0
    ready_poll_s: float = 1.0
    worker_node_conditions: Mapping[str, Sequence[str]] = field(default_factory=dict)
    check_machines: bool = False
    rng: random.Random = field(default_factory=random.Random)
    writes: list[Write] = field(default_factory=list, init=False)
    probes: list[Probe] = field(default_factory=list, init=False)
    crashed: ProberPanic | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.flows = scale_flows(self.dependents)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._backoff_until = 0.0

    # --- one probe: see, judge, act, record ----------------------------------------------------

    def probe_once(self) -> str:
        """One probe; returns its decision: "skipped: <why>", "no-scaling", "scale-up", "scale-down"."""
        started = time.monotonic()
        self._wait_out_backoff()
        try:
            candidates = self._see()
        except _Skipped as e:
            return self._record(started, f"skipped: {e}")
        try:
            verdict = judge_leases(candidates, datetime.now(UTC), self.kcm_grace_s, self.failure_fraction)
        except ProberPanic as e:
            self._record(started, f"panic: {e}")
            raise
        errors = () if verdict.action == "no-scaling" else self._run_flow(verdict.action)
        return self._record(started, verdict.action, verdict, errors)

    def verdict(self) -> Verdict:
        """What a probe would decide now, without acting or recording (tests wait on it)."""
        return judge_leases(self._see(), datetime.now(UTC), self.kcm_grace_s, self.failure_fraction)

    def _see(self) -> list[Mapping[str, Any]]:
        self._shoot_get("probe API server", "/version")
        nodes = self._shoot_get("list nodes", "/api/v1/nodes")["items"]
        machines = self._machines() if self.check_machines else None
        leases = self._shoot_get("list leases", leases_path(NODE_LEASE_NAMESPACE))["items"]
        return candidate_leases(leases, judge_nodes(nodes, machines, self.worker_node_conditions))

    def _shoot_get(self, what: str, path: str) -> dict[str, Any]:
        """A shoot GET on a connection of its own: DWD's probe transport has keep-alive off."""
        try:
            response = self.shoot.http.get(
                path, headers={"Connection": "close"}, timeout=self.probe_timeout_s
            )
            if response.status_code >= 300:
                raise api_error(response.status_code, response.content, response.headers)
            result: dict[str, Any] = response.json()
        except _Failure as e:
            self._note_throttling(e)
            raise _Skipped(f"{what} failed: {e}") from e
        return result

    def _machines(self) -> list[dict[str, Any]]:
        try:
            items: list[dict[str, Any]] = self.seed.get(MACHINES.format(ns=self.namespace))["items"]
        except _Failure as e:
            self._note_throttling(e)
            raise _Skipped(f"list machines failed: {e}") from e
        return items

    def _note_throttling(self, e: Exception) -> None:
        if isinstance(e, TooManyRequests):
            self._backoff_until = time.monotonic() + THROTTLE_BACKOFF_S

    def _wait_out_backoff(self) -> None:
        remaining = self._backoff_until - time.monotonic()
        if remaining > 0:
            self._halt.wait(remaining)
        self._backoff_until = 0.0

    def _record(
        self, started: float, decision: str, verdict: Verdict | None = None, errors: tuple[str, ...] = ()
    ) -> str:
        with self._lock:
            self.probes.append(Probe(started, time.monotonic(), decision, verdict, errors))
        return decision

    # --- the flows ------------------------------------------------------------------------------

    def _run_flow(self, op: Operation) -> tuple[str, ...]:
        """Level after level; a level with a failed dependent is the last of this probe."""
        for level in self.flows[op]:
            if len(level) == 1:
                results = [self._scale_with_retries(level[0], op)]
            else:
                with ThreadPoolExecutor(len(level), thread_name_prefix=f"dwd-{op}") as pool:
                    results = list(pool.map(lambda s: self._scale_with_retries(s, op), level))
            errors = tuple(e for e in results if e is not None)
            if errors:
                return errors
        return ()

    def _scale_with_retries(self, step: Step, op: Operation) -> str | None:
        error = None
        for _ in range(SCALE_ATTEMPTS):
            if self._halt.is_set():
                return f"{step.ref.name}: stopped"
            try:
                self._scale(step, op)
            except _Stopped:
                return f"{step.ref.name}: stopped"
            except (*_Failure, ScaleError) as e:
                error = f"{step.ref.name}: {e}"
            else:
                return None
            if self._halt.wait(SCALE_RETRY_BACKOFF_S):
                return f"{step.ref.name}: stopped"
        return error

    def _scale(self, step: Step, op: Operation) -> None:
        """One attempt at one dependent (scale.go, resScaler.scale)."""
        if self._halt.wait(step.initial_delay_s):
            raise _Stopped
        path = step.ref.object_path(self.namespace)
        try:
            annotations = self.seed.get(path)["metadata"].get("annotations") or {}
        except NotFound:
            if step.optional:
                return
            raise
        if ignores_scaling(annotations):
            if MELTDOWN in annotations:
                self._remove_meltdown(step, path)
            return
        current = self.seed.get(f"{path}/scale")["spec"].get("replicas", 0)
        if not (current == 0 if op == "scale-up" else current > 0):
            if op == "scale-up" and MELTDOWN in annotations:
                self._remove_meltdown(step, path)
            return
        if op == "scale-down":
            marks = {REPLICAS: str(current), MELTDOWN: ""}
            self._write(step, "PATCH", path, {"metadata": {"annotations": marks}})
        target = 0 if op == "scale-down" else target_replicas(annotations)
        scale = self.seed.get(f"{path}/scale")  # fresh, for its resourceVersion
        scale["spec"]["replicas"] = target
        self._write(step, "PUT", f"{path}/scale", scale)
        if op == "scale-up":
            self._remove_meltdown(step, path)
        self._wait_ready(step, path, op)

    def _remove_meltdown(self, step: Step, path: str) -> None:
        self._write(step, "PATCH", path, {"metadata": {"annotations": {MELTDOWN: None}}})

    def _wait_ready(self, step: Step, path: str, op: Operation) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            try:
                ready = (self.seed.get(path).get("status") or {}).get("readyReplicas", 0)
            except _Failure:
                ready = None
            if ready is not None and (ready >= 1 if op == "scale-up" else ready == 0):
                return
            if self._halt.wait(self.ready_poll_s):
                raise _Stopped
        want = ">= 1" if op == "scale-up" else "0"
        raise ScaleError(f"readyReplicas not {want} within {self.ready_timeout_s}s")

    def _write(self, step: Step, method: str, path: str, body: dict[str, Any]) -> None:
        sent = time.monotonic()
        if method == "PUT":
            self.seed.put(path, body)
        else:
            self.seed.merge_patch(path, body)
        with self._lock:
            self.writes.append(Write(method, path, body, sent, step.ref.name))

    # --- what tests read ------------------------------------------------------------------------

    def scaled(self, name: str) -> list[int]:
        """The replicas of each scale write to dependent ``name``, in order."""
        with self._lock:
            return [w.body["spec"]["replicas"] for w in self.writes if w.name == name and w.method == "PUT"]

    def writes_to(self, name: str) -> list[Write]:
        with self._lock:
            return [w for w in self.writes if w.name == name]

    # --- the loop -------------------------------------------------------------------------------

    def start(self) -> ProberStandIn:
        self._thread = threading.Thread(target=self._run, name=f"dwd-{self.namespace}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ends the loop; a flow under way stops at its next wait, as DWD's on a cancelled context."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def next_wait_s(self) -> float:
        """``wait.Jitter``: the interval stretched by up to ``jitter`` of itself (none at jitter <= 0)."""
        if self.jitter <= 0:
            return self.probe_interval_s
        return self.probe_interval_s * (1 + self.jitter * self.rng.random())

    def _run(self) -> None:
        if self._halt.wait(self.initial_delay_s):
            return
        while not self._halt.is_set():
            try:
                self.probe_once()
            except ProberPanic as e:
                self.crashed = e
                return
            if self._halt.wait(self.next_wait_s()):
                return

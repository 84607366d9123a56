"""The aggregator's configuration, grouped by concern (docs/design.md, "Fixed and tunable").

Each group is a frozen dataclass that checks its own relations where it is built
(as client-go's leaderelection checks its config), so a group made in a test is
held to the same rules as one read from the environment. ``from_env`` reads
every group and reports every bad variable at once. The variables and their
defaults are a contract; the timings without a variable are the ones no
operator has needed to change.

A variable's default is written once, in its field (``core.config.var``), with
the reason in the field's docstring; ``from_env`` reads it from there and a test
checks the README's tables against the fields.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from aggregator.model.backoff import Backoff
from aggregator.model.candidates import NodeConditions
from core import lease
from core.config import EnvReader, read_vars, var
from core.durations import format_duration
from core.errors import ConfigError
from core.lease import DEFAULT_LEASE_NAMESPACE, LEGACY_LEASE_NAMESPACE, is_dns_label, is_dns_subdomain
from core.logs import LogFormat

TargetsMode = Literal["env", "file", "gardener", "extension"]

# Settings of earlier releases (core/config.py EnvReader): a renamed one is still read under its
# old name and a retired one accepted, each with a warning, for one release after the one that
# changed it (CHANGELOG.md says which). Unknown DWD_ variables stay fatal: a typo'd
# DWD_DRY_RUN would scale for real.
RENAMED: dict[str, str] = {}
RETIRED: dict[str, str] = {}


def _check(problems: list[str]) -> None:
    if problems:
        raise ConfigError(problems)


FRACTIONS = ("DWD_RECOVERY_FRACTION", "DWD_FAILURE_FRACTION")


def fractions_out_of_order(recovery: float, failure: float, names: tuple[str, str] = FRACTIONS) -> str | None:
    """The rule between the two fractions, named by ``names`` (a shoot's own fields where it sets
    them: aggregator/model/protection.py)."""
    return f"{names[0]}: {recovery} must not exceed {names[1]} ({failure})" if recovery > failure else None


def _readable(r: EnvReader, name: str, path: str) -> None:
    if path and not os.access(path, os.R_OK):
        r.problem(name, f"{path} is not a readable file")


def _namespace(r: EnvReader, name: str, value: str) -> None:
    if value and not is_dns_label(value):
        r.problem(name, f"{value!r} is not a valid namespace name")


def _node_conditions(r: EnvReader, name: str) -> NodeConditions | None:
    text = r.string(name, "")
    if not text:
        return NodeConditions()
    if text.lower() == "off":
        return None
    try:
        return NodeConditions.parse(text)
    except ValueError as e:
        r.problem(name, f"{e} (or 'off')")
        return NodeConditions()


@dataclass(frozen=True)
class DeciderSettings:
    """What the decision judges by (aggregator/decide/)."""

    lease_duration_s: float = var("DWD_LEASE_DURATION", 6.0, "duration", min_s=1, max_s=300)
    """Three renewals at the agent's 2 s: a renewal lost and its window (4 s) spent never make a
    node stale. 8 s before 2026-12-05: the path benchmark at 6 s and at 8 s, side by side, gave
    no false scale-down at either (docs/measured.md, "Shorter defaults")."""
    node_grace_s: float = var("DWD_NODE_GRACE", 60.0, "duration")
    """A new node's agent needs time to start; until then it is not a candidate."""
    failure_fraction: float = var("DWD_FAILURE_FRACTION", 0.6, "fraction")
    """dependency-watchdog's threshold."""
    recovery_fraction: float = var("DWD_RECOVERY_FRACTION", 0.4, "fraction")
    """Hysteresis: a quorum that wobbles around 0.6 does not flap the controllers."""
    confirm_period_s: float = var("DWD_CONFIRM_PERIOD", 3.0, "duration")
    """The quorum must hold that long: cut -> verdict is lease duration + this, 9 s, well
    inside KCM's 40-50 s grace; the interlocks and level 0 (MCM, CA) add about a second. 4 s
    before 2026-12-05."""
    recovery_period_s: float = var("DWD_RECOVERY_PERIOD", 10.0, "duration")
    """With the recovery fraction, the hysteresis of the way back."""
    roll_allowance_s: float = var("DWD_ROLL_ALLOWANCE", 30.0, "duration", min_s=1, max_s=600)
    """How long a released lease (a roll, a drain) waits before its kubelet alone may call the
    node cut off where the second witness cannot answer yet (no read since a start, no kubelet
    lease); where it can, the kubelet decides from a lease duration on. Never a route to a
    quorum by itself (docs/decision.md, "A lease its agent released")."""
    min_candidates: int = var("DWD_MIN_CANDIDATES", 2, "integer", min_value=1)
    """Fewer: no verdict (never a reason to scale down, nor to stay down)."""
    fast_interval_s: float = lease.renew_interval_var()
    """The renewal interval of the fast sample, handed to the agents in their leases."""
    blind_limit_s: float = var("DWD_BLIND_LIMIT", 120.0, "duration", min_s=1)
    """Scaled down and unable to see the shoot at all (its KAPI unreachable from the seed,
    credentials revoked) this long, the controllers are restored: holding them at 0 on no
    evidence is never the default, but a KAPI restart of a minute must not flap them."""
    # The second witness (aggregator/decide/witness.py). Kubelet leases are LISTed this often by the
    # leader, as dependency-watchdog LISTs them on every probe: kubelet renews every 10 s, so
    # about every LIST sees a renewal of every kubelet that can reach KAPI, bracketed by two reads.
    witness_every_s: float = 10.0
    # A kubelet's next renewal is taken as due this long after its interval has passed: for it to
    # land on a slow path (kubelet stamps renewTime before its PUT, and the PUT's own time
    # stretches its next wait) and for a node clock that NTP stepped by up to half a second.
    witness_slack_s: float = 1.5
    # dependency-watchdog's unhealthy conditions per worker pool (DWD_NODE_CONDITIONS), on by
    # default as in DWD; None ("off") reads no node status at all: no condition and no
    # in-place-update rule, and the nodes are watched as metadata only.
    node_conditions: NodeConditions | None = field(default_factory=NodeConditions)
    # The Machines (aggregator/observe/machines.py) are LISTed this often while it matters (a
    # candidate is stale, the shoot unhealthy), and once more right before a scale-down ...
    machines_every_s: float = 10.0
    # ... and otherwise only this often: for /status, since while nothing is stale leaving a
    # node out changes no verdict. 250 shoots a seed make a LIST every 1.2 s at 5 min.
    machines_idle_s: float = 300.0
    # A failed read keeps the last read's Failed/Terminating nodes out this long (those are
    # the end of a Machine's life; they do not come back), then the rule is off until a read
    # succeeds: an unreadable seed must not leave nodes out for ever.
    machines_keep_s: float = 600.0
    # A read of the Machines that takes longer fails (the last one stays in force): the tick,
    # and before a scale-down the interlocks, wait for it. 500 Machines are ~5 MB a page.
    machines_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        problems = []
        if self.fast_interval_s * 2 > self.lease_duration_s:
            problems.append(
                f"DWD_LEASE_DURATION: {format_duration(self.lease_duration_s)} must be at least twice "
                f"DWD_RENEW_INTERVAL ({format_duration(self.fast_interval_s)}): one lost renewal must "
                "not make a node stale"
            )
        if (order := fractions_out_of_order(self.recovery_fraction, self.failure_fraction)) is not None:
            problems.append(order)
        if self.roll_allowance_s < self.lease_duration_s:
            problems.append(
                f"DWD_ROLL_ALLOWANCE: {format_duration(self.roll_allowance_s)} must be at least "
                f"DWD_LEASE_DURATION ({format_duration(self.lease_duration_s)}): a released lease "
                "is never stale before a renewed one would be"
            )
        if self.blind_limit_s < self.lease_duration_s:
            problems.append(
                f"DWD_BLIND_LIMIT: {format_duration(self.blind_limit_s)} must be at least "
                f"DWD_LEASE_DURATION ({format_duration(self.lease_duration_s)})"
            )
        _check(problems)

    def with_pools(self, pools: Mapping[str, tuple[str, ...]] | None) -> DeciderSettings:
        """A shoot's own per-pool conditions (its Cluster's) over the setting's; off stays off."""
        if not pools or self.node_conditions is None:
            return self
        return replace(self, node_conditions=self.node_conditions.with_pools(pools))

    @property
    def tick_s(self) -> float:
        """How often each target judges: a quarter lease, so detection is late by at most that."""
        return min(1.0, self.lease_duration_s / 4)

    @property
    def witness_margin_s(self) -> float:
        """How much later than its agent a kubelet must have renewed to prove the path: the
        agent's interval and a second, so a kubelet that renewed just before a cut, an
        interval after its agent's last renewal, proves nothing."""
        return self.fast_interval_s + 1.0

    @property
    def witness_bracket_s(self) -> float:
        """The widest bracket of two kubelet lease reads in which a renewal is placed by the
        node's own clock: half as long again as the reads' interval, for ticks that run late
        under load. Wider (the reads stopped), the bracket alone places it
        (aggregator/decide/witness.py); a node clock stepped by less than this inside a bracket is
        not seen as a step."""
        return self.witness_every_s * 1.5

    @property
    def stall_s(self) -> float:
        """A tick later than this past its due time means our own process stalled."""
        return min(2.0, self.lease_duration_s / 4)

    @classmethod
    def from_env(cls, r: EnvReader) -> DeciderSettings:
        values = read_vars(r, cls)
        node_conditions = _node_conditions(r, "DWD_NODE_CONDITIONS")
        try:
            return cls(**values, node_conditions=node_conditions)
        except ConfigError as e:
            r.problems.extend(e.problems)
            return cls()


MAX_SHARDS = 16


@dataclass(frozen=True)
class LeaderSettings:
    """Leader election on a seed Lease (aggregator/lead/leader.py), with client-go's defaults."""

    enabled: bool = var("DWD_LEADER_ELECTION", False, "boolean")
    """``true`` for more than one replica: only the leader writes."""
    namespace: str = "garden"
    lease_duration_s: float = var("DWD_LEADER_LEASE_DURATION", 15.0, "duration", min_s=1)
    """client-go's default, as the renew deadline and the retry period."""
    renew_deadline_s: float = var("DWD_LEADER_RENEW_DEADLINE", 10.0, "duration", min_s=0.5)
    retry_period_s: float = var("DWD_LEADER_RETRY_PERIOD", 2.0, "duration", min_s=0.1)
    shards: int = var("DWD_SHARDS", 1, "integer", min_value=1)
    """Shard Leases the targets are shared out over (aggregator/lead/shards.py); 1: one Lease, whose
    holder acts on every target. Two or more need leader election, and pay off only with as
    many replicas: a seed-wide outage's interlocks and writes are split between them."""

    def __post_init__(self) -> None:
        if self.shards > 1 and not self.enabled:
            _check(["DWD_SHARDS: more than one shard needs DWD_LEADER_ELECTION=true"])
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s:
            # client-go rejects the same: a leader must stop before a standby may start.
            _check(
                [
                    "DWD_LEADER_RENEW_DEADLINE: needs DWD_LEADER_LEASE_DURATION "
                    f"({format_duration(self.lease_duration_s)}) > DWD_LEADER_RENEW_DEADLINE "
                    f"({format_duration(self.renew_deadline_s)}) > DWD_LEADER_RETRY_PERIOD "
                    f"({format_duration(self.retry_period_s)})"
                ]
            )

    @classmethod
    def from_env(cls, r: EnvReader) -> LeaderSettings:
        values = read_vars(r, cls)
        default_namespace = r.env.get("POD_NAMESPACE") or cls.namespace
        namespace = r.string("DWD_LEADER_ELECTION_NAMESPACE", default_namespace)
        _namespace(r, "DWD_LEADER_ELECTION_NAMESPACE", namespace)
        if (shards := values["shards"]) > MAX_SHARDS:
            r.problem("DWD_SHARDS", f"{shards} is above the maximum {MAX_SHARDS} (a Lease renewed each)")
            values["shards"] = MAX_SHARDS
        try:
            return cls(**values, namespace=namespace)
        except ConfigError as e:
            r.problems.extend(e.problems)
            return cls(values["enabled"], namespace)


@dataclass(frozen=True)
class WatchSettings:
    """How the shoot is watched, and when the view of it stops being trusted."""

    # The server ends every watch after this and it is restarted at once.
    timeout_s: float = 10.0
    # Each watch asks for up to this fraction more, drawn anew at every restart, as client-go's
    # reflector does: all asking 10 s, 500 watches of 250 targets restarted in the same 0.3 s.
    timeout_jitter: float = 0.2
    # A watch running this long past its timeout sits on a dead connection.
    grace_s: float = 15.0
    # Silence this long past a watch's timeout means the view may be frozen.
    silence_s: float = 15.0
    backoff: Backoff = Backoff(0.5, 5.0, jitter=0.2)
    # The interlock's probe of the shoot KAPI, on a new connection.
    probe_timeout_s: float = 3.0

    def watch_timeout_s(self) -> float:
        """The timeout one watch asks the server for: whole seconds (the API's timeoutSeconds),
        so the client's own deadlines are the server's."""
        drawn = self.timeout_s * (1 + random.uniform(0, self.timeout_jitter))
        return float(max(1, round(drawn))) if self.timeout_s >= 1 else drawn

    @property
    def fresh_s(self) -> float:
        return self.timeout_s * (1 + self.timeout_jitter) + self.silence_s


@dataclass(frozen=True)
class ProvisionSettings:
    """The leases: where they live, and the write budget that paces their renewals."""

    lease_namespace: str = var("DWD_LEASE_NAMESPACE", DEFAULT_LEASE_NAMESPACE, "string")
    legacy_namespace: str = var("DWD_LEGACY_LEASE_NAMESPACE", LEGACY_LEASE_NAMESPACE, "string")
    """Where the old layout's leases (named like their nodes) are read during a move, while this
    aggregator may list them there; ``-``: never."""
    write_budget: float = var("DWD_WRITE_BUDGET", 100.0, "number")
    """Lease writes per second the heartbeats may cost a shoot: kubelet's own leases are 500/s
    at 5000 nodes, this adds at most a fifth."""
    # The provisioner's own writes, so a 5000-node start does not burst on KAPI.
    writes_per_s: float = 50.0
    # The leases are re-checked on every change, and this often regardless.
    recheck_s: float = 10.0

    @classmethod
    def from_env(cls, r: EnvReader) -> ProvisionSettings:
        values = read_vars(r, cls)
        _namespace(r, "DWD_LEASE_NAMESPACE", values["lease_namespace"])
        if values["legacy_namespace"] == "-":  # off (an empty variable is the default)
            values["legacy_namespace"] = ""
        if values["legacy_namespace"]:
            _namespace(r, "DWD_LEGACY_LEASE_NAMESPACE", values["legacy_namespace"])
        return cls(**values)


@dataclass(frozen=True)
class ScaleSettings:
    """The actuator (aggregator/act/scaler.py) and what it scales."""

    dry_run: bool = var("DWD_DRY_RUN", False, "boolean")
    """Decide, log and count every write it would make; write nothing to the seed but the
    election's Leases."""
    dependents_file: str = var("DWD_DEPENDENTS_FILE", "", "string")
    """YAML in dependency-watchdog's ``dependentResourceInfos`` shape; empty: DWD's order."""
    # Once converged while scaled down, look again this often: someone may scale a
    # protected controller back up by hand.
    reverify_s: float = 10.0
    # A dependent that needs more writes than this in one tick continues next tick.
    steps_per_tick: int = 3
    # On the way down, a level written to its target is read again (from the seed's watch) this
    # often, this many times, within the same tick, until its controllers have followed: the
    # next level starts when they have, not a whole tick later (dependency-watchdog polls
    # every second).
    follow_poll_s: float = 0.2
    follow_polls: int = 5


@dataclass(frozen=True)
class ShootSettings:
    """Where the shoots come from (aggregator/observe/sources.py) and how the fleet runs them."""

    mode: TargetsMode = "env"
    file: str = ""
    shoot_kubeconfig: str = ""
    seed_kubeconfig: str = ""
    namespace: str = ""
    kubeconfig_secret: str = var("DWD_KUBECONFIG_SECRET", "shoot-access-dwd-lease-aggregator", "string")
    """The Secret in each control-plane namespace that reaches the shoot (file: and gardener)."""
    shoot_server: str = var("DWD_SHOOT_SERVER", "https://kube-apiserver.{namespace}.svc", "string")
    """Where a shoot's API server is reached, for a Secret with only Gardener's token requestor's
    ``token`` and ``bundle.crt``; ``{namespace}`` is its control-plane namespace."""
    extension_type: str = var("DWD_EXTENSION_TYPE", "dwd-lease", "string")
    """With ``DWD_TARGETS=extension``: the ``spec.type`` of the Extensions that turn a shoot on,
    the type our ControllerRegistration names (one registration, one type per landscape)."""
    shoot_objects: str = var("DWD_SHOOT_OBJECTS", "", "string")
    """With ``DWD_TARGETS=extension``: the objects every served shoot gets
    (manifests/gardener/shoot/objects.yaml), delivered as a ManagedResource; empty: the
    extension delivers nothing, the shoot part is installed another way."""
    agent_image: str = var("DWD_AGENT_IMAGE", "", "string")
    """The agents' image in what the extension delivers (the chart's image vector); empty:
    the image the objects name."""
    # A targets file is read again this often; a watched source is looked at this often
    # besides its changes (a change itself is acted on at once).
    poll_s: float = 5.0
    # A target that failed is started again after these delays.
    restart: Backoff = Backoff(2.0, 60.0)
    # An Extension operation that failed is taken up again after these delays, while gardenlet
    # asks nothing new (controller-runtime backs a failed reconcile off likewise, to 1000 s).
    retry: Backoff = Backoff(5.0, 300.0)
    # The leader lists our records across the seed this often (and when it starts leading,
    # and when a target is removed): a record no target serves is an orphan to restore.
    sweep_s: float = 60.0
    # While orphans wait for their restore, they are looked at this often.
    orphan_recheck_s: float = 2.0

    @classmethod
    def from_env(cls, r: EnvReader) -> ShootSettings:
        raw = r.string("DWD_TARGETS", "env")
        mode: TargetsMode = "env"
        file = ""
        if raw == "gardener":
            mode = "gardener"
        elif raw == "extension":
            mode = "extension"
        elif raw.startswith("file:"):
            mode, file = "file", raw.removeprefix("file:")
            _readable(r, "DWD_TARGETS", file)
        elif raw != "env":
            r.problem("DWD_TARGETS", f"{raw!r} is not env, file:PATH, gardener or extension")
        shoot_kubeconfig = r.string("DWD_SHOOT_KUBECONFIG", required=mode == "env")
        _readable(r, "DWD_SHOOT_KUBECONFIG", shoot_kubeconfig)
        seed_kubeconfig = r.string("DWD_SEED_KUBECONFIG", "")
        _readable(r, "DWD_SEED_KUBECONFIG", seed_kubeconfig)
        namespace = r.string("DWD_NAMESPACE", required=mode == "env")
        _namespace(r, "DWD_NAMESPACE", namespace)
        values = read_vars(r, cls)
        server = values["shoot_server"]
        if not server.startswith("https://") or server.replace("{namespace}", "").count("{"):
            r.problem(
                "DWD_SHOOT_SERVER", f"{server!r} is not https://HOST[:PORT] (with {{namespace}} at most)"
            )
        _readable(r, "DWD_SHOOT_OBJECTS", values["shoot_objects"])
        if not is_dns_subdomain(values["extension_type"]):
            r.problem("DWD_EXTENSION_TYPE", f"{values['extension_type']!r} is not a valid extension type")
        return cls(mode, file, shoot_kubeconfig, seed_kubeconfig, namespace, **values)


@dataclass(frozen=True)
class ServeSettings:
    """The HTTP server and the logs."""

    metrics_addr: tuple[str, int] | None = None
    log_format: LogFormat = "auto"
    log_level: str = "info"


@dataclass(frozen=True)
class Settings:
    shoots: ShootSettings = field(default_factory=ShootSettings)
    decider: DeciderSettings = field(default_factory=DeciderSettings)
    leader: LeaderSettings = field(default_factory=LeaderSettings)
    watching: WatchSettings = field(default_factory=WatchSettings)
    provisioning: ProvisionSettings = field(default_factory=ProvisionSettings)
    scaling: ScaleSettings = field(default_factory=ScaleSettings)
    serving: ServeSettings = field(default_factory=ServeSettings)
    # Settings of the release before that are set (RENAMED, RETIRED): warned about at start.
    deprecated: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Every variable read and checked; every problem raised at once (ConfigError). A
        ``DWD_`` variable the aggregator does not know is one: its writes are the dangerous
        direction, and a typo'd ``DWD_DRY_RUN`` would scale for real."""
        r = EnvReader(env, renamed=RENAMED, retired=RETIRED)
        settings = cls.read(r)
        r.problems.extend(r.unknown())
        r.finish()
        return replace(settings, deprecated=tuple(r.deprecated()))

    @classmethod
    def read(cls, r: EnvReader) -> Settings:
        shoots = ShootSettings.from_env(r)
        provisioning = ProvisionSettings.from_env(r)
        decider = DeciderSettings.from_env(r)
        scaling = ScaleSettings(**read_vars(r, ScaleSettings))
        _readable(r, "DWD_DEPENDENTS_FILE", scaling.dependents_file)
        leader = LeaderSettings.from_env(r)
        metrics_addr = r.address("DWD_METRICS_ADDR")
        serving = ServeSettings(metrics_addr, *r.logging())
        return cls(
            shoots=shoots,
            decider=decider,
            leader=leader,
            provisioning=provisioning,
            scaling=scaling,
            serving=serving,
        )

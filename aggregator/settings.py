"""The aggregator's configuration, from the environment (docs/design.md, "Fixed and tunable").

Defaults, and why:
- DWD_LEASE_DURATION 8s: four renewals at the agent's 2 s; one or two lost
  packets never make a node stale.
- DWD_CONFIRM_PERIOD 4s: the quorum must hold that long before any scale-down.
  Cut -> verdict is lease duration + confirm period, 12 s, well inside KCM's
  40-50 s grace; the interlocks and level 0 (MCM, CA) add about a second.
- DWD_RECOVERY_FRACTION 0.4 and DWD_RECOVERY_PERIOD 10s: hysteresis so a
  quorum that wobbles around 0.6 does not flap the controllers.
- DWD_NODE_GRACE 60s: a new node's agent needs time to start; until then it
  is not a candidate.
- DWD_BLIND_LIMIT 2m: scaled down and unable to see the shoot at all (its KAPI
  unreachable from the seed, credentials revoked) for this long, the
  controllers are restored: holding them at 0 on no evidence is never the
  default, but a KAPI restart of a minute must not flap them either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from aggregator.decider import Params
from core.config import EnvReader
from core.lease import DEFAULT_LEASE_NAMESPACE, is_dns_label
from core.logs import LogFormat

TargetsMode = Literal["env", "file", "gardener"]


@dataclass(frozen=True)
class Settings:
    shoot_kubeconfig: str = ""
    seed_kubeconfig: str = ""
    namespace: str = ""
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    lease_duration_s: float = 8.0
    renew_interval_s: float = 2.0
    node_grace_s: float = 60.0
    failure_fraction: float = 0.6
    recovery_fraction: float = 0.4
    confirm_period_s: float = 4.0
    recovery_period_s: float = 10.0
    min_candidates: int = 2
    blind_limit_s: float = 120.0
    dependents_file: str = ""
    targets: TargetsMode = "env"
    targets_file: str = ""
    dry_run: bool = False
    leader_election: bool = False
    metrics_addr: tuple[str, int] | None = None
    write_budget: float = 100.0
    kubeconfig_secret: str = "shoot-access-dwd-lease-aggregator"
    leader_namespace: str = "garden"
    leader_lease_duration_s: float = 15.0
    leader_renew_deadline_s: float = 10.0
    leader_retry_period_s: float = 2.0
    log_format: LogFormat = "auto"
    log_level: str = "info"

    def decider_params(self) -> Params:
        return Params(
            lease_duration_s=self.lease_duration_s,
            node_grace_s=self.node_grace_s,
            failure_fraction=self.failure_fraction,
            recovery_fraction=self.recovery_fraction,
            confirm_period_s=self.confirm_period_s,
            recovery_period_s=self.recovery_period_s,
            min_candidates=self.min_candidates,
            fast_interval_s=self.renew_interval_s,
            blind_limit_s=self.blind_limit_s,
        )

    @property
    def tick_s(self) -> float:
        """How often each target judges: a quarter lease, so detection is late by at most that."""
        return min(1.0, self.lease_duration_s / 4)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        r = EnvReader(env)
        targets_raw = r.string("DWD_TARGETS", "env")
        targets: TargetsMode = "env"
        targets_file = ""
        if targets_raw == "gardener":
            targets = "gardener"
        elif targets_raw.startswith("file:"):
            targets, targets_file = "file", targets_raw.removeprefix("file:")
            if not os.access(targets_file, os.R_OK):
                r.problem("DWD_TARGETS", f"{targets_file} is not a readable file")
        elif targets_raw != "env":
            r.problem("DWD_TARGETS", f"{targets_raw!r} is not env, file:PATH or gardener")

        shoot_kubeconfig = r.string("DWD_SHOOT_KUBECONFIG", required=targets == "env")
        if shoot_kubeconfig and not os.access(shoot_kubeconfig, os.R_OK):
            r.problem("DWD_SHOOT_KUBECONFIG", f"{shoot_kubeconfig} is not a readable file")
        seed_kubeconfig = r.string("DWD_SEED_KUBECONFIG", "")
        if seed_kubeconfig and not os.access(seed_kubeconfig, os.R_OK):
            r.problem("DWD_SEED_KUBECONFIG", f"{seed_kubeconfig} is not a readable file")
        namespace = r.string("DWD_NAMESPACE", required=targets == "env")
        if namespace and not is_dns_label(namespace):
            r.problem("DWD_NAMESPACE", f"{namespace!r} is not a valid namespace name")
        lease_namespace = r.string("DWD_LEASE_NAMESPACE", DEFAULT_LEASE_NAMESPACE)
        if not is_dns_label(lease_namespace):
            r.problem("DWD_LEASE_NAMESPACE", f"{lease_namespace!r} is not a valid namespace name")

        lease_duration = r.duration("DWD_LEASE_DURATION", "8s", min_s=1, max_s=300)
        renew_interval = r.duration("DWD_RENEW_INTERVAL", "2s", min_s=0.2, max_s=300)
        if renew_interval * 2 > lease_duration:
            r.problem(
                "DWD_LEASE_DURATION",
                "must be at least twice DWD_RENEW_INTERVAL (one lost renewal must not make a node stale)",
            )
        node_grace = r.duration("DWD_NODE_GRACE", "60s")
        failure = r.fraction("DWD_FAILURE_FRACTION", 0.6)
        recovery = r.fraction("DWD_RECOVERY_FRACTION", 0.4)
        if recovery > failure:
            r.problem("DWD_RECOVERY_FRACTION", f"{recovery} must not exceed DWD_FAILURE_FRACTION ({failure})")
        confirm = r.duration("DWD_CONFIRM_PERIOD", "4s")
        recovery_period = r.duration("DWD_RECOVERY_PERIOD", "10s")
        min_candidates = r.integer("DWD_MIN_CANDIDATES", 2, min_value=1)
        blind_limit = r.duration("DWD_BLIND_LIMIT", "2m", min_s=1)
        if blind_limit < lease_duration:
            r.problem("DWD_BLIND_LIMIT", "must be at least DWD_LEASE_DURATION")
        dependents = r.string("DWD_DEPENDENTS_FILE", "")
        if dependents and not os.access(dependents, os.R_OK):
            r.problem("DWD_DEPENDENTS_FILE", f"{dependents} is not a readable file")
        dry_run = r.boolean("DWD_DRY_RUN", False)
        leader_election = r.boolean("DWD_LEADER_ELECTION", False)
        metrics = r.address("DWD_METRICS_ADDR")
        budget = r.number("DWD_WRITE_BUDGET", 100.0)
        secret = r.string("DWD_KUBECONFIG_SECRET", "shoot-access-dwd-lease-aggregator")
        leader_ns = r.string("DWD_LEADER_ELECTION_NAMESPACE", env.get("POD_NAMESPACE") or "garden")
        if not is_dns_label(leader_ns):
            r.problem("DWD_LEADER_ELECTION_NAMESPACE", f"{leader_ns!r} is not a valid namespace name")
        le_duration = r.duration("DWD_LEADER_LEASE_DURATION", "15s", min_s=1)
        le_deadline = r.duration("DWD_LEADER_RENEW_DEADLINE", "10s", min_s=0.5)
        le_retry = r.duration("DWD_LEADER_RETRY_PERIOD", "2s", min_s=0.1)
        if not le_duration > le_deadline > le_retry:
            # client-go rejects the same: a leader must stop before a standby may start.
            r.problem(
                "DWD_LEADER_RENEW_DEADLINE",
                "needs DWD_LEADER_LEASE_DURATION > DWD_LEADER_RENEW_DEADLINE > DWD_LEADER_RETRY_PERIOD",
            )
        log_format, log_level = r.logging()
        r.finish()
        return cls(
            shoot_kubeconfig=shoot_kubeconfig,
            seed_kubeconfig=seed_kubeconfig,
            namespace=namespace,
            lease_namespace=lease_namespace,
            lease_duration_s=lease_duration,
            renew_interval_s=renew_interval,
            node_grace_s=node_grace,
            failure_fraction=failure,
            recovery_fraction=recovery,
            confirm_period_s=confirm,
            recovery_period_s=recovery_period,
            min_candidates=min_candidates,
            blind_limit_s=blind_limit,
            dependents_file=dependents,
            targets=targets,
            targets_file=targets_file,
            dry_run=dry_run,
            leader_election=leader_election,
            metrics_addr=metrics,
            write_budget=budget,
            kubeconfig_secret=secret,
            leader_namespace=leader_ns,
            leader_lease_duration_s=le_duration,
            leader_renew_deadline_s=le_deadline,
            leader_retry_period_s=le_retry,
            log_format=log_format,
            log_level=log_level,
        )

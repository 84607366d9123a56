"""What one shoot's target is made of, wired from the settings: what every target of the
process shares (``Shared``), and the parts of its own (``Parts``): the informers of its nodes
and leases, the view's trust window, the reads beside the watches, the interlocks, the pacer
and the provisioner. aggregator/target.py runs them; nothing here runs on its own."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from structlog.typing import FilteringBoundLogger

from aggregator.act.interlocks import Interlocks
from aggregator.act.pacer import Pacer
from aggregator.act.provisioner import Provisioner
from aggregator.decide.trust import TrustWindow
from aggregator.kube.client import KubeApi
from aggregator.lead.scope import Scope
from aggregator.model.dependents import Dependent
from aggregator.model.eligibility import skipped
from aggregator.model.settings import DeciderSettings, Settings
from aggregator.observe.evidence import Evidence
from aggregator.observe.seeddependents import SeedDependents
from aggregator.observe.watcher import Informer, Observed, legacy_informer, shoot_informers
from aggregator.ops.metrics import AggregatorMetrics
from aggregator.report import Reporter
from core.lease import LeaseView


def _no_lag(_since: float) -> float:
    return 0.0


@dataclass(frozen=True)
class Shared:
    """What every target of one process shares: the settings, the seed's clients, the
    dependents, the metrics, the seed's watch of the dependents, the loop's lag and the clocks.
    Built once (aggregator/fleet.py); a target adds only its own shoot and leadership."""

    settings: Settings
    seed: KubeApi
    dependents: Sequence[Dependent]
    metrics: AggregatorMetrics = field(default_factory=AggregatorMetrics)
    watched: SeedDependents | None = None
    events: KubeApi | None = None  # the seed client Events go by (their own pace)
    lag_since: Callable[[float], float] = _no_lag
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


@dataclass
class Parts:
    """One shoot's parts, each built once and handed what it reads."""

    observed: Observed
    nodes: Informer[Any]
    leases: Informer[LeaseView]
    legacy: Informer[LeaseView] | None
    view: TrustWindow
    evidence: Evidence
    interlocks: Interlocks
    pacer: Pacer
    provisioner: Provisioner
    watches_fresh: Callable[[], bool]

    def listed(self) -> bool:
        return self.nodes.synced.is_set() and self.leases.synced.is_set()

    def status(self, now: float, params: DeciderSettings) -> dict[str, Any]:
        """What the shoot looks like now: its leases, its pacing, the reads beside the watches."""
        pacing, observed, machines = self.pacer.last(), self.observed, self.evidence.machines
        left_out = skipped(observed.nodes, observed.leases, now, params, machines.phases())
        return {
            "fast_nodes": len(pacing.fast),
            "heartbeat_writes_per_s": round(pacing.writes_per_s(len(observed.nodes)), 2),
            "lease_ages": {k: round(v, 2) for k, v in sorted(observed.lease_ages().items())},
            "skipped": dict(sorted(left_out.items())),
            "kubelet_leases_error": self.evidence.kubelets.error,
            "machines": {
                "rule": machines.rule(),
                "error": machines.error,
                "age_s": None if (age := machines.age_s()) is None else round(age, 1),
            },
        }


def wire(
    name: str,
    namespace: str,
    shoot: KubeApi,
    shared: Shared,
    *,
    params: DeciderSettings,
    scope: Scope,
    report: Reporter,
    log: FilteringBoundLogger,
) -> Parts:
    """The parts of shoot ``name``, each handed what it reads and what it reports to."""
    settings, clock = shared.settings, shared.clock
    observed, nodes, leases, legacy = _informers(name, shoot, shared, params, report)
    view = TrustWindow(params.lease_duration_s, tick_s=params.tick_s, stall_s=params.stall_s, log=log)
    evidence = Evidence.of(shoot, shared.seed, namespace, params, clock=clock, log=log)
    fresh_s = settings.watching.fresh_s
    pacer, provisioner = _lease_writers(
        name, shoot, observed, shared, params=params, scope=scope, report=report
    )

    def watches_fresh() -> bool:
        return leases.fresh(fresh_s) and nodes.fresh(fresh_s)

    return Parts(
        observed=observed,
        nodes=nodes,
        leases=leases,
        legacy=legacy,
        view=view,
        evidence=evidence,
        interlocks=Interlocks(
            shoot,
            leases,
            evidence,
            view,
            watches_fresh=watches_fresh,
            probe_timeout_s=settings.watching.probe_timeout_s,
            lag_since=shared.lag_since,
            clock=clock,
        ),
        pacer=pacer,
        provisioner=provisioner,
        watches_fresh=watches_fresh,
    )


def _lease_writers(
    name: str,
    shoot: KubeApi,
    observed: Observed,
    shared: Shared,
    *,
    params: DeciderSettings,
    scope: Scope,
    report: Reporter,
) -> tuple[Pacer, Provisioner]:
    """Who renews fast and who slowly (the pacer), and the leases kept in line with the nodes
    under this replica's term (the provisioner)."""
    provisioning, clock = shared.settings.provisioning, shared.clock
    budget = provisioning.write_budget
    pacer = Pacer(
        observed,
        fast_interval_s=params.fast_interval_s,
        write_budget=budget,
        clock=clock,
        wall=shared.wall,
        on_plan=functools.partial(report.planned, write_budget=budget),
    )
    provisioner = Provisioner(
        shoot,
        observed,
        provisioning,
        lease_duration_s=params.lease_duration_s,
        label=name,
        clock=clock,
        deadline=scope.term_end,
    )
    return pacer, provisioner


def _informers(
    name: str, shoot: KubeApi, shared: Shared, params: DeciderSettings, report: Reporter
) -> tuple[Observed, Informer[Any], Informer[LeaseView], Informer[LeaseView] | None]:
    """What is observed of the shoot, and the informers that feed it: its nodes, its leases,
    and the old layout's leases during a move."""
    settings, clock, wall = shared.settings, shared.clock, shared.wall
    observed = Observed(clock=clock, wall=lambda: datetime.fromtimestamp(wall(), UTC))
    nodes, leases = shoot_informers(
        shoot,
        observed,
        lease_namespace=settings.provisioning.lease_namespace,
        full_nodes=params.node_conditions is not None,
        settings=settings.watching,
        clock=clock,
        label=name,
        on_restart=report.watch_restarted,
    )
    legacy = settings.provisioning.legacy_namespace
    if not legacy:
        return observed, nodes, leases, None
    old = legacy_informer(shoot, observed, legacy, settings=settings.watching, clock=clock, label=name)
    return observed, nodes, leases, old

"""The aggregator's Prometheus metrics."""

from __future__ import annotations

from aggregator.model.verdict import Phase
from core.metrics import Registry


class AggregatorMetrics:
    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or Registry()
        self._verdicts(self.registry)
        self._actions(self.registry)
        self._replica(self.registry)

    def _verdicts(self, r: Registry) -> None:
        """What each target sees and judges."""
        self.candidates = r.gauge("dwd_target_candidates", "Nodes whose lease counts.", ["target"])
        self.stale = r.gauge(
            "dwd_target_stale_nodes", "Candidates not seen renewing for a lease duration.", ["target"]
        )
        self.fraction = r.gauge(
            "dwd_target_stale_fraction",
            "What the verdict judged: stale / candidates, or a sample's stratified estimate.",
            ["target"],
        )
        self.zone_fraction = r.gauge(
            "dwd_target_zone_stale_fraction",
            'stale / candidates among one zone\'s candidates (zone "" when nodes have no zone label).',
            ["target", "zone"],
        )
        self.phase = r.gauge(
            "dwd_target_phase",
            "1 for the phase the target is in (starting, healthy, confirming, scaled-down, recovering).",
            ["target", "phase"],
        )
        self.fast_nodes = r.gauge(
            "dwd_target_fast_nodes",
            "Nodes renewing at the fast interval (the sample when over budget).",
            ["target"],
        )
        self.heartbeat_writes = r.gauge(
            "dwd_target_heartbeat_writes_per_second",
            "Lease writes per second the intervals handed out add up to.",
            ["target"],
        )
        self.synced = r.gauge(
            "dwd_target_synced", "1 when both watches have listed and are fresh.", ["target"]
        )
        self.path_alive = r.gauge(
            "dwd_target_agent_silent_path_alive",
            "Candidates whose agent is silent while their kubelet renews after it: not counted stale.",
            ["target"],
        )
        self.tick = r.gauge(
            "dwd_target_tick_seconds", "How long the target's last tick took (its I/O included).", ["target"]
        )
        self.watch_restarts = r.counter(
            "dwd_watch_restarts_total",
            "Watches that ended other than by their timeout.",
            ["target", "resource", "reason"],
        )
        self.probe_failures = r.counter(
            "dwd_probe_failures_total", "Failed internal probes of the shoot KAPI.", ["target"]
        )

    def _actions(self, r: Registry) -> None:
        """What the actuator does and refuses, and what it finds others did."""
        self.target_dry_run = r.gauge(
            "dwd_target_dry_run",
            "1 when the target's scaling is only reported (its providerConfig's or the seed's dry run).",
            ["target"],
        )
        self.scale_actions = r.counter(
            "dwd_scale_actions_total",
            "Scale actions by resource, direction and result.",
            ["target", "resource", "direction", "result"],
        )
        self.blocked = r.counter(
            "dwd_scale_down_blocked_total", "Scale-downs an interlock stopped.", ["target", "reason"]
        )
        self.target_errors = r.counter(
            "dwd_target_errors_total", "Times a target failed and was restarted.", ["target"]
        )
        self.foreign_records = r.gauge(
            "dwd_target_foreign_records",
            "Dependents carrying dependency-watchdog's replicas or meltdown-protection-active without "
            "our record, as last read: somebody else's, never acted on.",
            ["target"],
        )
        self.overridden = r.counter(
            "dwd_dependent_raised_by_others_total",
            "Times a dependent held at 0 was found raised by someone else (and lowered again).",
            ["target", "resource"],
        )
        self.missing = r.gauge(
            "dwd_dependent_missing",
            "1 while a dependent that is not optional does not exist.",
            ["target", "resource"],
        )
        self.dry_run_writes = r.counter(
            "dwd_dry_run_writes_total",
            "Scale writes a dry-run decided on and did not make.",
            ["target", "resource", "direction"],
        )
        self.orphans = r.gauge(
            "dwd_orphan_records",
            "Dependents carrying our record whose target this aggregator no longer serves.",
        )

    def _replica(self, r: Registry) -> None:
        """This process: its event loop, its leadership, its mode."""
        self.loop_lag = r.histogram(
            "dwd_event_loop_lag_seconds",
            "How late a 100 ms timer of the event loop every target shares fired.",
            [],
            [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
        )
        self.leader = r.gauge(
            "dwd_leader", "1 while this replica is the leader (sharded: while it holds any shard)."
        )
        self.leading = r.gauge(
            "dwd_target_leading",
            "1 where this replica acts for the target (its leader, or its shard's holder); a "
            "replica that does not still judges it, and its phase series say what it would do.",
            ["target"],
        )
        self.shards_held = r.gauge("dwd_shards_held", "Shard Leases this replica holds (DWD_SHARDS > 1).")
        self.dry_run = r.gauge("dwd_dry_run", "1 when scaling is only reported.")

    def set_phase(self, target: str, phase: Phase) -> None:
        for p in Phase:
            self.phase.set(1.0 if p is phase else 0.0, target=target, phase=str(p))

    def forget(self, target: str) -> None:
        """Every series of a target that is gone: a seed's churn must not grow /metrics for ever."""
        for metric in self.registry.labelled("target"):
            metric.remove_matching(target=target)

"""The shoot's own alerts (aggregator/extension/monitoring.py ``RULES``) under promtool, on the
series the shoot's Prometheus keeps of the aggregator's (one target's, two replicas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aggregator.extension import monitoring
from tests.alerting import needs_promtool, promtool, series

GROUPS = monitoring.prometheus_rule("shoot--p--s")["spec"]["groups"]
T = "shoot--p--s"


def replica(
    instance: str, *, leading: str, phase: str, synced: str, dry: str = "0x30"
) -> list[dict[str, str]]:
    """One replica's series of the target: ``phase`` the values of scaled-down's gauge."""
    labels = {"instance": instance, "target": T}
    return [
        series("dwd_target_leading", leading, **labels),
        series("dwd_target_phase", phase, phase="scaled-down", **labels),
        series("dwd_target_synced", synced, **labels),
        series("dwd_target_dry_run", dry, **labels),
    ]


def fires(at: str, name: str, count: int) -> dict[str, Any]:
    rule = next(r for r in monitoring.RULES if r["alert"] == name)
    expected = {"exp_labels": dict(rule["labels"]), "exp_annotations": dict(rule["annotations"])}
    return {"eval_time": at, "alertname": name, "exp_alerts": [expected] * count}


def check(tmp_path: Path, input_series: list[dict[str, str]], *alerts: dict[str, Any]) -> None:
    done = promtool(
        tmp_path,
        {"interval": "1m", "input_series": input_series, "alert_rule_test": list(alerts)},
        groups=GROUPS,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_held_down_fires_from_the_leader_alone_and_never_in_dry_run(tmp_path: Path) -> None:
    # The standby sees the cut too (scaled-down) but does not act: only the leader's counts.
    leader = replica("a", leading="1x30", phase="0x4 1x25", synced="1x30")
    standby = replica("b", leading="0x30", phase="0x4 1x25", synced="1x30")
    check(
        tmp_path,
        leader + standby,
        fires("3m", "DwdLeaseControllersHeldDown", 0),
        fires("6m", "DwdLeaseControllersHeldDown", 1),
    )
    dry = replica("a", leading="1x30", phase="0x4 1x25", synced="1x30", dry="1x30")
    check(tmp_path, dry, fires("6m", "DwdLeaseControllersHeldDown", 0))
    only_standby = replica("b", leading="0x30", phase="1x30", synced="1x30")
    check(tmp_path, only_standby, fires("6m", "DwdLeaseControllersHeldDown", 0))


@needs_promtool
def test_cannot_judge_fires_after_ten_minutes_without_a_fresh_view(tmp_path: Path) -> None:
    blind = replica("a", leading="1x30", phase="0x30", synced="1x2 0x28")
    check(tmp_path, blind, fires("8m", "DwdLeaseCannotJudge", 0), fires("14m", "DwdLeaseCannotJudge", 1))
    standby_blind = replica("b", leading="0x30", phase="0x30", synced="0x30")
    check(tmp_path, standby_blind, fires("20m", "DwdLeaseCannotJudge", 0))

"""The aggregator as a seed service: many targets, leader election, dry-run, metrics and status."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from aggregator.model.records import MELTDOWN, REPLICAS
from testenv.base.process import Process
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply
from testenv.gardener.seed_objects import CLUSTER_CRD, cluster
from testenv.kube.controllers import CONTROLLERS, DOWN, KCM
from testenv.kube.controlplane import ControlPlane, ensure_namespace, free_port
from testenv.worlds.shoot_world import Shoot, shoot_for
from tests import chromium
from tests.alerting import alert, check, samples, scrape, scraped, series

pytestmark = pytest.mark.integration


FILE_MODE = {"DWD_SHOOT_KUBECONFIG": "", "DWD_NAMESPACE": ""}


def status(port: int) -> dict[str, Any]:
    result: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/status", trust_env=False, timeout=5).json()
    return result


def metrics(port: int) -> dict[str, float]:
    return samples(scrape(port))


def target(port: int, name: str) -> dict[str, Any]:
    targets: list[dict[str, Any]] = status(port)["targets"]
    for t in targets:
        if t["name"] == name:
            return t
    return {}


def up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", trust_env=False, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def targets_file(tmp: Path, *namespaces: str) -> str:
    path = tmp / "targets.yaml"
    path.write_text(yaml.safe_dump({"targets": [{"namespace": ns} for ns in namespaces]}))
    return f"file:{path}"


def test_three_targets_one_broken(shoot: Shoot, seed_plane: ControlPlane, tmp_path: Path) -> None:
    shoot.setup()
    shoot.store_access(shoot.aggregator_access("agg-token"))
    with shoot_for(seed_plane, shoot.namespace + "-b", tmp_path / "b") as other:
        (tmp_path / "b").mkdir(exist_ok=True)
        other.setup()
        other.store_access(other.aggregator_access("agg-token"))
        broken = shoot.namespace + "-x"
        ensure_namespace(shoot.seed_admin, broken)
        apply(
            shoot.seed_admin,
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "shoot-access-dwd-lease-aggregator", "namespace": broken},
                    "stringData": {"kubeconfig": "apiVersion: v1\nkind: Config\nclusters: []\n"},
                }
            ],
        )
        port = free_port()
        shoot.start_aggregator(
            {
                **FILE_MODE,
                "DWD_TARGETS": targets_file(tmp_path, shoot.namespace, other.namespace, broken),
                "DWD_METRICS_ADDR": f"127.0.0.1:{port}",
            }
        )
        wait_for(lambda: up(port), 30, "the aggregator to serve")
        shoot.wait_leases_renewed()
        other.wait_leases_renewed()
        wait_for(lambda: target(port, other.namespace).get("phase") == "healthy", 30, "both healthy")
        wait_for(lambda: target(port, shoot.namespace).get("phase") == "healthy", 30, "both healthy")

        shoot.driver.alive -= {f"node-{i}" for i in range(7)}
        other.driver.alive -= {f"node-{i}" for i in range(7)}
        wait_for(lambda: shoot.replicas() == DOWN and other.replicas() == DOWN, 30, "both scaled down")
        held = scrape(port)
        shoot.driver.alive |= {f"node-{i}" for i in range(7)}
        other.driver.alive |= {f"node-{i}" for i in range(7)}
        wait_for(lambda: shoot.replicas() == CONTROLLERS and other.replicas() == CONTROLLERS, 30, "both back")

        bad = target(port, broken)
        assert "kubeconfig" in bad["error"] and broken in bad["error"]
        m = metrics(port)
        # Built all the same and blind (every request fails with why): not judging, not crashing.
        assert m[f'dwd_target_synced{{target="{broken}"}}'] == 0
        assert m[f'dwd_target_synced{{target="{shoot.namespace}"}}'] == 1
        assert (
            m[
                f'dwd_scale_actions_total{{target="{other.namespace}",resource="kube-controller-manager",direction="down",result="scaled"}}'
            ]
            == 1
        )
    # The alerts, on what the aggregator exported while it held both shoots down.
    both = [{"target": ns} for ns in sorted((shoot.namespace, other.namespace))]
    check(
        tmp_path,
        scraped(held, instance="aggregator"),
        alert("1m", "DwdLeaseShootScaledDown", *[b | {"severity": "warning"} for b in both]),
        alert("9m", "DwdLeaseShootScaledDownLong"),
        alert("11m", "DwdLeaseShootScaledDownLong", *[b | {"severity": "critical"} for b in both]),
        alert("4m", "DwdLeaseTargetNotSynced"),
        alert("6m", "DwdLeaseTargetNotSynced", {"severity": "warning", "target": broken}),
        alert("6m", "DwdLeaseTargetUnled"),
    )


def test_a_target_that_keeps_crashing_alerts(shoot: Shoot, tmp_path: Path) -> None:
    """A bug planted in every target (tests/integration/planted_crash.py): restarted with
    back-off, it protects nothing, and its errors are what the alert sees."""
    shoot.setup()
    port = free_port()
    shoot.start_aggregator(
        {"DWD_METRICS_ADDR": f"127.0.0.1:{port}"}, module="tests.integration.planted_crash"
    )
    errors = f'dwd_target_errors_total{{target="{shoot.namespace}"}}'
    wait_for(lambda: up(port) and metrics(port).get(errors, 0) >= 1, 30, "the first crash")
    first, at = scrape(port), time.monotonic()
    wait_for(lambda: metrics(port)[errors] > samples(first)[errors], 30, "the next crash")
    then, apart_s = scrape(port), time.monotonic() - at
    assert "RuntimeError: a bug planted by the test" in target(port, shoot.namespace)["error"]
    check(
        tmp_path,
        scraped(first, then, apart_s=apart_s, instance="aggregator"),
        alert("5m", "DwdLeaseTargetFailing"),
        alert("7m", "DwdLeaseTargetFailing", {"severity": "warning", "target": shoot.namespace}),
    )


def test_gardener_clusters_hibernated_then_reconciled(shoot: Shoot) -> None:
    from testenv.gardener.apply import RESOURCES

    RESOURCES.setdefault("Cluster", ("clusters", False))
    shoot.setup()
    shoot.store_access(shoot.aggregator_access("agg-token"))
    apply(shoot.seed_admin, [CLUSTER_CRD])
    wait_for(lambda: _crd_established(shoot), 20, "the Cluster CRD")
    apply(
        shoot.seed_admin,
        [cluster(shoot.namespace, hibernation=True, hibernated=True)],
    )
    port = free_port()
    agg = shoot.start_aggregator(
        {**FILE_MODE, "DWD_TARGETS": "gardener", "DWD_METRICS_ADDR": f"127.0.0.1:{port}"}
    )
    wait_for(lambda: up(port) and status(port)["skipped"].get(shoot.namespace) == "hibernated", 30, "skipped")
    time.sleep(2)
    assert status(port)["targets"] == []
    assert "target_started" not in agg.names()

    apply(
        shoot.seed_admin,
        [cluster(shoot.namespace, last_operation=("Create", "Processing"))],
    )
    wait_for(
        lambda: status(port)["skipped"].get(shoot.namespace) == "being created",
        20,
        "waiting for reconcile",
    )
    assert status(port)["targets"] == []
    apply(
        shoot.seed_admin,
        [cluster(shoot.namespace, last_operation=("Create", "Succeeded"))],
    )
    wait_for(lambda: target(port, shoot.namespace).get("phase") == "healthy", 40, "a prober for the shoot")
    assert agg.names().count("target_started") == 1


def _crd_established(shoot: Shoot) -> bool:
    crd = shoot.seed_admin.get(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusters.extensions.gardener.cloud"
    )
    return any(
        c["type"] == "Established" and c["status"] == "True"
        for c in (crd.get("status") or {}).get("conditions") or []
    )


def test_rotated_kubeconfig_secret_keeps_working(shoot: Shoot, tmp_path: Path) -> None:
    shoot.setup()
    shoot.store_access(shoot.aggregator_access("token-a"))
    port = free_port()
    agg = shoot.start_aggregator(
        {
            **FILE_MODE,
            "DWD_TARGETS": targets_file(tmp_path, shoot.namespace),
            "DWD_METRICS_ADDR": f"127.0.0.1:{port}",
        }
    )
    shoot.wait_leases_renewed()
    wait_for(lambda: up(port) and target(port, shoot.namespace).get("phase") == "healthy", 30, "healthy")
    shoot.store_access(shoot.aggregator_access("token-b"))
    shoot.shoot_admin.request(
        "DELETE", "/api/v1/namespaces/kube-system/secrets/token-a", {"gracePeriodSeconds": 0}
    )
    wait_for(lambda: "kubeconfig_rotated" in agg.names(), 30, "the new secret to be read")
    time.sleep(11)  # past the API server's 10 s token cache: the old token is dead now
    shoot.driver.alive -= {f"node-{i}" for i in range(7)}
    wait_for(lambda: shoot.replicas() == DOWN, 40, "a scale-down with the rotated credentials")
    assert target(port, shoot.namespace)["error"] == ""


def _leader(aggs: list[Process]) -> Process | None:
    for a in aggs:
        changes = [e for e in a.events() if e["event"] == "leader_changed"]
        if changes and changes[-1]["leader"]:
            return a
    return None


def test_two_replicas_one_writer_and_takeover(shoot: Shoot, tmp_path: Path) -> None:
    shoot.setup()
    election = shoot.election_env()
    port_a, port_b = free_port(), free_port()
    a = shoot.start_aggregator({**election, "DWD_METRICS_ADDR": f"127.0.0.1:{port_a}"})
    b = shoot.start_aggregator({**election, "DWD_METRICS_ADDR": f"127.0.0.1:{port_b}"})
    leader = wait_for(lambda: _leader([a, b]), 30, "a leader")
    standby = b if leader is a else a
    shoot.wait_leases_renewed()
    time.sleep(3)
    assert "lease_created" in leader.names()
    assert "lease_created" not in standby.names()
    leaders_port, standbys_port = (port_a, port_b) if leader is a else (port_b, port_a)
    as_leader, as_standby = scrape(leaders_port), scrape(standbys_port)

    shoot.driver.alive -= {f"node-{i}" for i in range(8)}
    wait_for(
        lambda: any(shoot.annotation(n, REPLICAS) for n in CONTROLLERS),
        30,
        "the scale-down to start",
        every_s=0.02,
    )
    leader.kill()
    killed_at = time.monotonic()
    wait_for(lambda: shoot.replicas() == DOWN, 30, "the standby to finish the scale-down", every_s=0.1)
    assert time.monotonic() - killed_at < 4 + 3 + 5  # lease duration, then a tick and the levels
    assert {n: shoot.annotation(n, REPLICAS) for n in CONTROLLERS} == {
        k: str(v) for k, v in CONTROLLERS.items()
    }
    assert any(e["event"] == "leader_changed" and e["leader"] for e in standby.events())

    shoot.driver.alive |= {f"node-{i}" for i in range(8)}
    wait_for(lambda: shoot.replicas() == CONTROLLERS, 30, "recovery by the new leader", every_s=0.1)
    # The record goes only after each scale-up is done.
    wait_for(
        lambda: all(shoot.annotation(n, MELTDOWN) is None for n in CONTROLLERS), 10, "the records removed"
    )
    assert not [e for e in leader.events() if e["event"] == "resource_scaled_up"]

    # The alerts, on what the replicas exported. The leader gone, what is left is the standby's
    # view: judged, acted for by nobody until it takes over.
    check(
        tmp_path,
        scraped(as_standby, instance="b"),
        alert("1m", "DwdLeaseTargetUnled"),
        alert("3m", "DwdLeaseTargetUnled", {"severity": "critical", "target": shoot.namespace}),
    )
    # A replica's leadership as it changed here (standby, then leader), back and forth every minute.
    was, became = samples(as_standby)["dwd_leader"], samples(scrape(standbys_port))["dwd_leader"]
    assert (samples(as_leader)["dwd_leader"], was, became) == (1, 0, 1)
    changing = [was] * 4 + [became, was] * 4 + [became]
    check(
        tmp_path,
        [series("dwd_leader", " ".join(f"{v:g}" for v in changing), instance="b")],
        alert("7m", "DwdLeaseLeadershipFlapping"),
        alert("8m", "DwdLeaseLeadershipFlapping", {"severity": "warning", "value": "5"}),
    )


def test_dry_run_reports_and_scales_nothing(shoot: Shoot) -> None:
    shoot.setup()
    port = free_port()
    agg = shoot.start_aggregator({"DWD_DRY_RUN": "true", "DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
    shoot.wait_leases_renewed()
    wait_for(lambda: up(port) and target(port, shoot.namespace).get("phase") == "healthy", 30, "healthy")
    shoot.driver.alive -= {f"node-{i}" for i in range(7)}
    wait_for(lambda: target(port, shoot.namespace).get("phase") == "scaled-down", 30, "the dry-run verdict")
    m = metrics(port)
    assert m[f'dwd_target_phase{{target="{shoot.namespace}",phase="scaled-down"}}'] == 1
    assert m["dwd_dry_run"] == 1
    assert m["dwd_leader"] == 1  # no election: the only replica leads
    assert status(port)["dry_run"] is True
    dry = [e for e in agg.events() if e["event"] == "dry_run_write"]
    assert {e["resource"] for e in dry} == set(CONTROLLERS)
    assert m[f'dwd_dry_run_writes_total{{target="{shoot.namespace}",resource="{KCM}",direction="down"}}'] >= 1
    time.sleep(1)
    assert shoot.replicas() == CONTROLLERS
    assert all(shoot.annotation(n, REPLICAS) is None for n in CONTROLLERS)
    assert not [e for e in shoot.events() if e["reason"] in ("ScaledDown", "ScaledUp")]


def test_status_page_in_chromium(shoot: Shoot, tmp_path: Path) -> None:
    import os

    shoot.setup()
    port = free_port()
    shoot.start_aggregator({"DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
    shoot.wait_leases_renewed()
    wait_for(lambda: up(port) and target(port, shoot.namespace).get("phase") == "healthy", 30, "healthy")
    shoot.driver.alive -= {"node-0", "node-1"}
    time.sleep(4)  # two stale leases and a few minutes... of history, in seconds
    url = f"http://127.0.0.1:{port}/"
    dom = chromium.dump_dom(url, tmp_path / "profile")
    assert shoot.namespace in dom
    assert ">healthy<" in dom
    assert "node-0" in dom and "stale" in dom
    shot = Path(os.environ.get("DWDDEV_STATUS_SCREENSHOT", tmp_path / "status.png"))
    chromium.screenshot(url, shot, tmp_path / "profile", (1100, 700))


def test_status_cli(shoot: Shoot) -> None:
    import subprocess
    import sys

    shoot.setup(nodes=3)
    port = free_port()
    shoot.start_aggregator({"DWD_METRICS_ADDR": f"127.0.0.1:{port}"})
    wait_for(lambda: up(port) and target(port, shoot.namespace).get("phase") == "healthy", 30, "healthy")
    out = subprocess.run(
        [sys.executable, "-m", "aggregator", "status", "--url", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = out.splitlines()[1:3]
    assert header.split() == ["TARGET", "STATE", "SINCE", "STALE", "FRACTION", "WHY"]
    assert row.split()[:2] == [shoot.namespace, "healthy"]
    assert "0/3" in row
    bad = subprocess.run(
        [sys.executable, "-m", "aggregator", "status", "--url", f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert "status: http://127.0.0.1:" in bad.stderr

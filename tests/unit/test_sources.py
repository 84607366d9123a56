from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.objects import ClusterView
from aggregator.server import render_page, render_table
from aggregator.sources import FileSource, TargetSpec
from core.errors import KubeconfigError


def cluster(**shoot: Any) -> dict[str, Any]:
    spec = {"provider": {"workers": [{"name": "pool"}]}, **shoot.pop("spec", {})}
    status = {"lastOperation": {"type": "Reconcile", "state": "Succeeded"}, **shoot.pop("status", {})}
    return {
        "metadata": {"name": "shoot--p--s", **shoot.pop("metadata", {})},
        "spec": {"shoot": {"spec": spec, "status": status}},
    }


@pytest.mark.parametrize(
    ("c", "why"),
    [
        (cluster(), ""),
        (cluster(metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}), "deleting"),
        (cluster(spec={"hibernation": {"enabled": True}}), "hibernated"),
        (cluster(status={"isHibernated": True}), "hibernated"),
        (cluster(spec={"provider": {"workers": []}}), "worker-less"),
        (cluster(status={"lastOperation": {"type": "Migrate", "state": "Processing"}}), "migrating"),
        (cluster(status={"lastOperation": {"type": "Restore", "state": "Error"}}), "migrating"),
        (cluster(status={"lastOperation": {"type": "Restore", "state": "Succeeded"}}), ""),
        (cluster(status={"lastOperation": {"type": "Create", "state": "Processing"}}), "not yet reconciled"),
        (cluster(status={"lastOperation": {}}), "not yet reconciled"),
        (cluster(status={"lastOperation": {"type": "Reconcile", "state": "Error"}}), ""),
    ],
)
def test_cluster_skip_reason(c: dict[str, Any], why: str) -> None:
    assert ClusterView.from_object(c) == ClusterView("shoot--p--s", why)


async def test_file_source(tmp_path: Path) -> None:
    p = tmp_path / "targets.yaml"
    p.write_text(
        "targets:\n  - namespace: a\n  - namespace: b\n    kubeconfigSecret: s\n"
        "  - namespace: c\n    kubeconfig: /k\n"
    )
    got = await FileSource(str(p), "default-secret").desired()
    assert got == {
        "a": TargetSpec("a", "a", kubeconfig_secret="default-secret"),
        "b": TargetSpec("b", "b", kubeconfig_secret="s"),
        "c": TargetSpec("c", "c", kubeconfig_path="/k"),
    }
    p.write_text("targets:\n  - name: x\n")
    with pytest.raises(KubeconfigError, match="entry 0 needs a namespace"):
        await FileSource(str(p), "d").desired()


STATUS = {
    "identity": "pod-1",
    "leader": True,
    "dry_run": True,
    "failure_fraction": 0.6,
    "lease_duration_s": 8,
    "targets": [
        {
            "name": "shoot--p--<a>",
            "phase": "scaled-down",
            "since": 0,
            "stale": 7,
            "candidates": 10,
            "fraction": 0.7,
            "reason": "7/10 stale",
            "history": [[0, 0.0], [10, 0.7]],
            "lease_ages": {"n1": 9.0, "n2": 1.0},
        }
    ],
}


def test_page_escapes_and_shows_what_matters() -> None:
    page = render_page(STATUS)
    assert (
        "shoot--p--&lt;a&gt;" in page and "<a>" not in page.split("<body>")[1].replace("<a", "", 0)[:0] + "x"
    )
    assert ">scaled-down<" in page
    assert "DRY RUN" in page
    assert 'class="lease stale" title="n1">n1 9.0s' in page
    assert 'class="lease fresh" title="n2">n2 1.0s' in page
    assert "<polyline" in page


def test_table() -> None:
    lines = render_table(STATUS).splitlines()
    assert lines[0] == "pod-1 (leader, dry-run)"
    assert lines[1].split() == ["TARGET", "STATE", "SINCE", "STALE", "FRACTION", "WHY"]
    assert lines[2].split()[:2] == ["shoot--p--<a>", "scaled-down"]
    assert "7/10" in lines[2] and "70%" in lines[2]

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from aggregator.model.lifecycle import ClusterView, Lifecycle
from aggregator.observe.sources import CLUSTERS, FileSource, GardenerSource, TargetSpec
from aggregator.ops.server import render_page, render_table
from core.errors import KubeconfigError, api_error
from testenv.gardener.seed_objects import cluster
from tests.unit.fakekube import FakeKube
from tests.unit.world import World

# dependency-watchdog v1.7.0's rules (controllers/cluster/cluster_controller.go), case by case;
# tests/integration/test_lifecycle_dwd.py compares every state with the real process.
# (Shoot fields, why a running target stops, why a new one does not start.)
LIFECYCLES: list[tuple[dict[str, Any], str, str]] = [
    ({}, "", ""),
    ({"deleting": True}, "deleting", ""),
    ({"hibernation": True, "hibernated": True}, "hibernated", ""),
    ({"hibernation": True}, "hibernated", ""),  # hibernating: not yet hibernated
    ({"hibernation": False, "hibernated": True}, "", "waking up"),
    ({"hibernated": True}, "", "waking up"),  # no hibernation section: not enabled
    ({"workers": 0}, "worker-less", ""),
    ({"last_operation": ("Migrate", "Processing")}, "migrating", "migrating"),
    ({"last_operation": ("Migrate", "Succeeded")}, "migrating", "migrating"),
    ({"last_operation": ("Restore", "Processing")}, "", "being restored"),
    ({"last_operation": ("Restore", "Succeeded")}, "", ""),
    ({"last_operation": ("Create", "Processing")}, "", "being created"),
    ({"last_operation": ("Create", "Succeeded")}, "", ""),
    ({"last_operation": ("Delete", "Succeeded")}, "", "being deleted"),
    ({"last_operation": ("Reconcile", "Error")}, "", ""),
    ({"last_operation": ("Reconcile", "Aborted")}, "", ""),
    ({"last_operation": None}, "", "not yet created"),
    ({"deleting": True, "last_operation": ("Delete", "Processing")}, "deleting", "being deleted"),
]


@pytest.mark.parametrize(("fields", "stop", "no_start"), LIFECYCLES)
def test_a_clusters_lifecycle_is_read_as_dependency_watchdog_reads_it(
    fields: dict[str, Any], stop: str, no_start: str
) -> None:
    view = ClusterView.from_object(cluster("shoot--p--s", **fields))
    assert view.lifecycle == Lifecycle(stop, no_start)
    assert view.lifecycle.serves(running=True) == (not stop)
    assert view.lifecycle.serves(running=False) == (not stop and not no_start)


def test_a_cluster_being_deleted_stops_its_target_whichever_object_says_so() -> None:
    c = cluster("shoot--p--s")
    c["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert Lifecycle.of(c).stop == "deleting"


async def test_a_running_target_keeps_running_through_states_in_which_none_would_start() -> None:
    """A reconcile that fails is Reconcile Error (serves); a restore under way stops no running
    target but starts none; after the source forgets (a restart), it starts none."""
    seed = FakeKube()
    path = f"{CLUSTERS}/shoot--p--s"
    seed.put(path, cluster("shoot--p--s"))
    source = GardenerSource(seed, "access")
    assert set(await _desired(source)) == {"shoot--p--s"}
    seed.put(path, cluster("shoot--p--s", last_operation=("Restore", "Processing")))
    assert set(await _desired(source)) == {"shoot--p--s"}
    fresh = GardenerSource(seed, "access")
    assert await _desired(fresh) == {} and fresh.skipped == {"shoot--p--s": "being restored"}
    seed.put(path, cluster("shoot--p--s", deleting=True, last_operation=("Delete", "Processing")))
    assert await _desired(source) == {} and source.skipped == {"shoot--p--s": "deleting"}


async def _desired(source: GardenerSource) -> dict[str, TargetSpec]:
    """What the source names after a fresh LIST of the seed as it is now."""
    source.informer.synced.clear()
    await source.informer.list_now()
    source.informer.synced.set()
    return await source.desired()


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


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        # Before, the second silently replaced the first.
        ("  - namespace: a\n  - namespace: a\n", "entry 1: target 'a' is named twice"),
        ("  - namespace: a\n  - {namespace: b, name: a}\n", "entry 1: target 'a' is named twice"),
        ("  - namespace: Shoot_A\n", "entry 0: 'Shoot_A' is not a valid namespace name"),
        # Two names, one shoot: both targets acted on the same controllers.
        (
            "  - {namespace: a, name: one}\n  - {namespace: a, name: two}\n",
            "entry 1: namespace 'a' already has target 'one'",
        ),
        ("  - {namespace: a, name: Bad Name/../x}\n", "entry 0: name 'Bad Name/../x' is not a valid name"),
        ("  - namespace: ../kube-system\n", "entry 0: '../kube-system' is not a valid namespace name"),
    ],
)
async def test_a_targets_file_with_a_target_twice_or_a_bad_namespace_is_refused(
    tmp_path: Path, targets: str, message: str
) -> None:
    p = tmp_path / "targets.yaml"
    p.write_text("targets:\n" + targets)
    with pytest.raises(KubeconfigError, match=re.escape(message)):
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


async def test_a_target_that_sees_nothing_of_its_shoot_is_not_shown_as_plainly_healthy() -> None:
    """A shoot that refuses the aggregator from the start: no view, nothing judged. Before, the
    table and the page showed it ``healthy`` like a shoot whose every node renews."""
    w = World()
    w.shoot.fail(error=lambda: api_error(401, '{"reason":"Unauthorized","message":"token revoked"}'))
    await w.run(20)
    seen: dict[str, Any] = {"identity": "a", "targets": [w.target.snapshot()]}
    assert seen["targets"][0]["phase"] == "healthy" and seen["targets"][0]["judging"] is False
    assert render_table(seen).splitlines()[2].split()[1:4] == ["healthy", "(not", "judging)"]
    assert "healthy (not judging)" in render_page(seen)
    judged = World()
    await judged.settle()
    assert judged.target.snapshot()["judging"] is True
    row = render_table({"targets": [judged.target.snapshot()]}).splitlines()[2]
    assert row.split()[1] == "healthy" and "not judging" not in row

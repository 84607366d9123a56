"""Gardener's Clusters and Shoots are built by testenv.gardener.seed_objects's builders alone
(``cluster()``, ``shoot()``): tests/integration/test_gardener_types.py checks every object they
can make against Gardener's own Go types, and a dict written inline escapes that check (an
``isHibernated`` for ``hibernated`` reads as "not hibernated" in Go, and the test on it proves
nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tests", "bench", "demo", "testenv")
BUILDERS = ROOT / "testenv" / "gardener" / "seed_objects.py"
# Keys only a Shoot (and so a Cluster) has on the wire, and the kinds themselves. Not
# "hibernated": the builders' keyword has the wire's name, and a dict of keywords is fine.
SHOOT_KEYS = frozenset({"lastOperation", "isHibernated"})
KINDS = frozenset({"Cluster", "Shoot"})


def inline_gardener_objects(source: str) -> list[tuple[int, str]]:
    """(line, what) of every dict literal in ``source`` that is a Cluster or Shoot, or a piece
    of one's status."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            if key.value in SHOOT_KEYS:
                out.append((key.lineno, f'key "{key.value}"'))
            elif key.value == "hibernation" and isinstance(value, ast.Dict):  # the keyword's a bool
                out.append((key.lineno, '"hibernation": {...}'))
            elif key.value == "kind" and isinstance(value, ast.Constant) and value.value in KINDS:
                out.append((key.lineno, f'"kind": "{value.value}"'))
    return sorted(out)


def test_no_cluster_or_shoot_is_built_outside_testenv_gardener() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} {what}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != BUILDERS and "go" not in path.relative_to(ROOT).parts
        for line, what in inline_gardener_objects(path.read_text())
    ]
    assert not found, "build it with testenv.gardener.seed_objects.cluster() or shoot():\n" + "\n".join(found)


def test_the_check_sees_a_cluster_a_shoot_and_a_status_written_inline() -> None:
    source = """
from testenv.gardener.seed_objects import cluster
fine = cluster("shoot--p--a", hibernation=True)
fine["spec"]["shoot"]["status"]["hibernated"] = True  # a change to a built one: checked there
other = {"kind": "Deployment", "status": {"replicas": 1}}
fields = {"hibernation": True, "hibernated": True, "last_operation": ("Create", "Failed")}
c = {
    "apiVersion": "extensions.gardener.cloud/v1alpha1",
    "kind": "Cluster",
}
s = {"kind": "Shoot"}
status = {"isHibernated": True,
          "lastOperation": {"type": "Reconcile"}}
spec = {"hibernation": {"enabled": True}}
"""
    assert inline_gardener_objects(source) == [
        (9, '"kind": "Cluster"'),
        (11, '"kind": "Shoot"'),
        (12, 'key "isHibernated"'),
        (13, 'key "lastOperation"'),
        (14, '"hibernation": {...}'),
    ]

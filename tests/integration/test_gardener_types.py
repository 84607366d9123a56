"""Our Gardener fixtures and manifests, decoded strictly with Gardener's own Go types (the release
GRM is built from, testenv/gardener/grm.py ``VERSION``): a schemaless CRD, or a field Gardener's own CRD
keeps unknown, takes anything, Go's decoder drops the ones it does not know, and a misspelt one
would read as unset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testenv.gardener import gardener_types, grm
from testenv.gardener.apply import kustomize_build, load_docs
from testenv.gardener.dependency_watchdog import shoot_states
from testenv.gardener.seed_objects import cluster, shoot

pytestmark = [
    pytest.mark.integration,
    pytest.mark.builds(grm.NAME),
    pytest.mark.usefixtures("gardener_checker"),
]

ROOT = Path(__file__).resolve().parents[2]


def _failures(objects: list[dict[str, Any]], labels: list[str]) -> list[str]:
    errors = gardener_types.strict_errors(objects)
    return [f"{label}: {error}" for label, error in zip(labels, errors, strict=True) if error]


def test_every_cluster_and_shoot_the_builders_make_is_what_gardener_decodes() -> None:
    objects, labels = [], []
    for i, state in enumerate(shoot_states(hibernation=(None, True, False))):
        objects += [cluster(f"shoot--p--s{i}", **state.fields()), shoot(f"s{i}", **state.fields())]
        labels += [f"cluster {state}", f"shoot {state}"]
    conditions = {"pool": ["ReadonlyFilesystem"], "pool-1": []}
    rich: dict[str, Any] = {"workers": 2, "node_conditions": conditions, "grace": "40s"}
    objects += [cluster("shoot--p--rich", machine_types=3, **rich), shoot("rich", **rich)]
    labels += ["cluster with node conditions, grace and machine types", "shoot with them"]
    assert _failures(objects, labels) == []
    print(f"\n{len(objects)} objects decoded strictly by Gardener's types in one run of the checker")


PLANTED = "status.isHibernated"


def _planted() -> list[tuple[dict[str, Any], str, tuple[str, ...]]]:
    """Objects with one mistake each, and what the checker's error must name."""
    hibernated = cluster("shoot--p--a")
    hibernated["spec"]["shoot"]["status"]["isHibernated"] = True
    capitalised = shoot("b")
    capitalised["status"]["lastOperation"]["State"] = capitalised["status"]["lastOperation"].pop("state")
    wrong_version = cluster("shoot--p--c")
    wrong_version["spec"]["seed"]["apiVersion"] = "core.gardener.cloud/v1alpha1"
    mr = {"apiVersion": "resources.gardener.cloud/v1alpha1", "kind": "ManagedResource"}
    return [
        (hibernated, "the field Go's struct tag calls status.hibernated", ("spec.shoot", PLANTED)),
        (capitalised, "a field name in another case", ("status.lastOperation.State",)),
        (wrong_version, "an embedded object of another version", ("spec.seed", "v1alpha1")),
        ({**mr, "spec": {"secretRef": [{"name": "x"}]}}, "a singular for a plural", ("spec.secretRef",)),
        (
            {"apiVersion": "core.gardener.cloud/v1beta1", "kind": "Project"},
            "a kind it does not know",
            ("Project",),
        ),
    ]


def test_a_misspelt_field_is_an_error_that_names_it() -> None:
    planted = _planted()
    errors = gardener_types.strict_errors([obj for obj, _, _ in planted])
    for (_, why, names), error in zip(planted, errors, strict=True):
        assert all(name in error for name in names), f"{why}: {error!r} should name {names}"
        print(f"{why}: {error}")


def _gardener_docs() -> list[tuple[str, dict[str, Any]]]:
    """Every object of a *.gardener.cloud group under manifests/gardener: as written, and as
    kustomize renders each kustomization there (a chart's templates are no YAML until rendered:
    tests/integration/test_extension_chart.py renders them)."""
    base = ROOT / "manifests" / "gardener"
    written = [p for p in sorted(base.rglob("*.yaml")) if "templates" not in p.relative_to(base).parts]
    docs = [(str(p.relative_to(ROOT)), d) for p in written for d in load_docs(p.read_text())]
    for kustomization in sorted(base.rglob("kustomization.yaml")):
        source = f"kustomize build {kustomization.parent.relative_to(ROOT)}"
        docs += [(source, d) for d in kustomize_build(kustomization.parent)]
    return [(where, d) for where, d in docs if _group(d).endswith("gardener.cloud")]


def _group(doc: dict[str, Any]) -> str:
    api_version = str(doc.get("apiVersion", ""))
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def test_the_gardener_manifests_are_what_gardener_decodes() -> None:
    found = _gardener_docs()
    kinds = {d["kind"] for _, d in found}
    assert {"ManagedResource", "ControllerRegistration", "ControllerDeployment"} <= kinds, kinds
    labels = [f"{where}: {d['kind']}/{d['metadata']['name']}" for where, d in found]
    assert _failures([d for _, d in found], labels) == []
    print(f"\n{len(found)} Gardener objects under manifests/gardener ({', '.join(sorted(kinds))}): strict")

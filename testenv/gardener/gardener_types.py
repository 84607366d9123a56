"""Gardener's own Go code asked about our objects (testenv/go/gardener-types/main.go, built beside
gardener-resource-manager from the same Gardener release), one verb a run:

- ``strict_errors``: a Cluster (and the Shoot, Seed and CloudProfile it embeds), a Shoot, Seed
  or CloudProfile, a ManagedResource, an Extension, a ControllerRegistration or a
  ControllerDeployment decoded strictly by Gardener's types. A schemaless CRD takes any field,
  and Go's JSON decoding drops a field it does not know: a fixture with
  ``status.isHibernated`` where Gardener writes ``status.hibernated`` would be read by
  dependency-watchdog as "not hibernated", and a test built on it would prove nothing. An
  unknown, misspelt or duplicate field is an error naming its path.
- ``extension_verdicts``: whether gardenlet counts an Extension as ready, by its own function
  (``health.CheckExtensionObject``).
- ``render_chart``: a ControllerDeployment's chart rendered by Gardener's ``chartrenderer``
  with the values gardenlet mixes in, as gardenlet renders it into a seed (and the seed's name
  injected into every container, as gardenlet injects it).
- ``find_images``: an image as Gardener's image vector resolves it under an overwrite.
- ``pull_chart``: a chart's OCI artifact pulled by gardener-operator's puller, from a registry
  on loopback the checker serves (``registry``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from testenv.gardener import grm

CHECKER = grm.GARDENER_TYPES


def build(*, force: bool = False, log: TextIO = sys.stderr) -> Path:
    """Build the checker unless it is cached (with GRM, when that is missing too: one go build)."""
    only = (CHECKER,) if not grm.missing(grm.GRM) else (grm.GRM, CHECKER)
    return grm.build(force=force, log=log, only=only)[CHECKER.name]


def find() -> Path:
    return grm.find(CHECKER)


def _run(verb: str, payload: object, timeout_s: float) -> str:
    """The checker's stdout for ``verb`` given ``payload`` as JSON on its stdin."""
    done = subprocess.run(
        [str(find()), verb],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{CHECKER.name} {verb} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def parse_answers(stdout: str, count: int) -> list[str]:
    """One string per object asked about, from a list verb's stdout."""
    answers = json.loads(stdout)
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise RuntimeError(f"{CHECKER.name} answered {stdout[:200]!r}, not a list of strings")
    if len(answers) != count:
        raise RuntimeError(f"{CHECKER.name} answered {len(answers)} for {count} objects")
    return answers


def strict_errors(objects: Sequence[dict[str, Any]], timeout_s: float = 60.0) -> list[str]:
    """One error string per object ("" for one Gardener's types decode strictly), from one run
    of the checker for the whole list."""
    return parse_answers(_run("check", list(objects), timeout_s), len(objects))


def extension_verdicts(extensions: Sequence[dict[str, Any]], timeout_s: float = 60.0) -> list[str]:
    """gardenlet's verdict on each Extension: "" where it counts it as ready, else the text of
    its error (a lastError, an outdated observedGeneration, an operation annotation not picked
    up, no Succeeded lastOperation, or one older than the timestamp annotation). An object that
    does not decode strictly as an Extension is a RuntimeError naming it."""
    return parse_answers(_run("check-extension", list(extensions), timeout_s), len(extensions))


def force_deletions(clusters: Sequence[dict[str, Any]], timeout_s: float = 60.0) -> list[bool]:
    """Whether Gardener's ``ShootNeedsForceDeletion`` says each Cluster's Shoot is confirmed for
    force deletion (a Cluster that does not decode strictly is a RuntimeError naming it)."""
    answers = parse_answers(_run("force-deletion", list(clusters), timeout_s), len(clusters))
    return [a == "true" for a in answers]


def shoot_conditions(
    asked: Sequence[tuple[dict[str, Any], dict[str, Any] | None]],
    threshold: str = "5m",
    timeout_s: float = 60.0,
) -> list[tuple[str, str, str]]:
    """What gardenlet's shoot care makes of each (Extension, its controller's heartbeat Lease or
    None) for the Shoot's ``SystemComponentsHealthy`` (``checker.CheckExtensionCondition``, with
    ``threshold`` for outdated reports): (status, reason, message) of the condition it forces, or
    ("", "", "") where it leaves the Shoot's condition to its other checks."""
    payload = [{"extension": ext, "heartbeat": beat, "threshold": threshold} for ext, beat in asked]
    answers = json.loads(_run("shoot-condition", payload, timeout_s))
    if not isinstance(answers, list) or len(answers) != len(asked):
        raise RuntimeError(f"{CHECKER.name} answered {str(answers)[:200]!r} for {len(asked)} requests")
    return [(str(a["status"]), str(a["reason"]), str(a["message"])) for a in answers]


@dataclass(frozen=True)
class GardenletValues:
    """What gardenlet makes its ``gardener.*`` chart values of: the Seed it runs for (a
    ``core.gardener.cloud/v1beta1`` Seed with ``status.clusterIdentity``), its own version (by
    default the release whose code renders) and the garden's cluster identity."""

    seed: dict[str, Any]
    gardener_version: str = grm.VERSION
    garden_cluster_identity: str = "garden"


@dataclass(frozen=True)
class RenderedChart:
    """A chart as gardenlet renders it: ``files`` keyed as in the ManagedResource Secret gardenlet
    stores them in, and the ``values`` they were rendered with (the chart's merged with
    gardenlet's)."""

    files: dict[str, str]
    values: dict[str, Any]

    def objects(self) -> list[dict[str, Any]]:
        """Every object rendered, in the files' key order."""
        return [d for _, text in sorted(self.files.items()) for d in yaml.safe_load_all(text) if d]


def parse_rendered(stdout: str) -> RenderedChart:
    answer = json.loads(stdout)
    if not isinstance(answer, dict) or not isinstance(answer.get("files"), dict):
        raise RuntimeError(f"{CHECKER.name} render-chart answered {stdout[:200]!r}, not files and values")
    return RenderedChart(files=answer["files"], values=answer.get("values") or {})


def render_chart(
    archive: bytes,
    *,
    release_name: str,
    namespace: str,
    kube_version: str,
    values: dict[str, Any] | None = None,
    gardenlet: GardenletValues | None = None,
    timeout_s: float = 60.0,
) -> RenderedChart:
    """``archive`` (``image.charts.archive``, or a ControllerDeployment's rawChart) rendered by Gardener's
    chartrenderer for a seed whose kube-apiserver is ``kube_version``, as release
    ``release_name`` (gardenlet: the ControllerRegistration's name) into ``namespace``
    (gardenlet: ``extension-<ControllerInstallation>``), with ``values`` (the
    ControllerDeployment's) and, given ``gardenlet``, the ``gardener`` values gardenlet mixes in."""
    request: dict[str, Any] = {
        "archive": base64.b64encode(archive).decode(),
        "releaseName": release_name,
        "namespace": namespace,
        "kubeVersion": kube_version,
        "values": values or {},
    }
    if gardenlet is not None:
        request["gardenlet"] = {
            "seed": gardenlet.seed,
            "gardenerVersion": gardenlet.gardener_version,
            "gardenClusterIdentity": gardenlet.garden_cluster_identity,
        }
    return parse_rendered(_run("render-chart", request, timeout_s))


@dataclass(frozen=True)
class ImageQuestion:
    """An image vector of one entry, ``name`` at ``ref``, under ``overwrite`` (Gardener's image
    vector format, as text)."""

    name: str
    ref: str
    overwrite: str = ""


def find_images(questions: Sequence[ImageQuestion], timeout_s: float = 60.0) -> list[str]:
    """Each image as Gardener resolves it (``imagevector.Read`` of the overwrite, merged over the
    vector, ``FindImage``): the image, or ``error: `` and why there is none."""
    request = [{"name": q.name, "ref": q.ref, "overwrite": q.overwrite} for q in questions]
    answers = json.loads(_run("find-images", request, timeout_s))
    if not isinstance(answers, list) or len(answers) != len(questions):
        raise RuntimeError(f"{CHECKER.name} find-images answered {str(answers)[:200]!r}")
    return [f"error: {a['error']}" if a.get("error") else str(a["image"]) for a in answers]


@contextlib.contextmanager
def registry() -> Iterator[str]:
    """An OCI registry on loopback (the checker's: go-containerregistry's own), its host:port,
    plain HTTP. Gone when the block ends."""
    with subprocess.Popen(
        [str(find()), "registry"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as p:
        assert p.stdout is not None and p.stdin is not None
        try:
            yield p.stdout.readline().strip()
        finally:
            p.stdin.close()
            p.wait(timeout=10)


def pull_chart(ref: str, timeout_s: float = 60.0) -> bytes:
    """The chart archive Gardener's ``HelmRegistry.Pull`` takes from the artifact at ``ref`` (the
    layer of Helm's type), as gardener-operator pulls an Extension's charts."""
    return base64.b64decode(json.loads(_run("pull-chart", ref, timeout_s))["chart"])

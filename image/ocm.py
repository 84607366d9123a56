"""The OCM component descriptor of a release: .ocm/component.yaml rendered with the version, the
commit and each image's digest (the OCI index an archive holds, what ``skopeo copy --all``
pushes), into build/images/component-descriptor.yaml."""

from __future__ import annotations

import copy
import json
import tarfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / ".ocm" / "component.yaml"
DESCRIPTOR = "component-descriptor.yaml"


def index_digest(oci_archive: Path) -> str:
    """``sha256:<hex>`` of the one image index (or manifest) an OCI archive names."""
    with tarfile.open(oci_archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{oci_archive}: no index.json")
        manifests = json.load(member)["manifests"]
    if len(manifests) != 1:
        raise ValueError(f"{oci_archive}: {len(manifests)} manifests in index.json, expected one")
    return str(manifests[0]["digest"])


def render(version: str, commit: str, repository: str, digests: dict[str, str]) -> dict[str, Any]:
    """The template with ``version`` everywhere, the source's ``commit`` and each image (by its
    resource name) pinned by ``digests``."""
    doc = copy.deepcopy(yaml.safe_load(TEMPLATE.read_text()))
    component = doc["component"]
    component["version"] = version
    for source in component["sources"]:
        source["version"] = version
        source["access"] = {"type": "gitHub", "repoUrl": repository, "commit": commit}
    for resource in component["resources"]:
        name = resource["name"]
        digest = digests[name]
        algorithm, _, value = digest.partition(":")
        if algorithm != "sha256" or len(value) != 64:
            raise ValueError(f"{name}: {digest!r} is not a sha256 digest")
        resource["version"] = version
        resource["access"] = {"type": "ociArtifact", "imageReference": f"{name}:{version}@{digest}"}
        resource["digest"] = {
            "hashAlgorithm": "SHA-256",
            "normalisationAlgorithm": "ociArtifactDigest/v1",
            "value": value,
        }
    return dict(doc)


def write(directory: Path, version: str, commit: str, repository: str, archives: dict[str, Path]) -> Path:
    """The descriptor of the images in ``archives`` (resource name -> its index archive)."""
    digests = {name: index_digest(path) for name, path in archives.items()}
    path = directory / DESCRIPTOR
    path.write_text(yaml.safe_dump(render(version, commit, repository, digests), sort_keys=False))
    return path

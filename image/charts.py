"""The extension's two charts as Helm's OCI artifacts, what gardener-operator pulls for an
``operator.gardener.cloud/v1alpha1`` Extension (manifests/gardener/operator/extension.yaml,
``helm.ociRepository``): the seed part (manifests/gardener/extension/chart), and the door
(manifests/gardener/admission/chart), which the operator renders into the virtual garden.

Each is written as an OCI layout in a tar (``build/charts/<name>.oci.tar``, skopeo's
``oci-archive:``), tagged with the release (VERSION, as the images are), with the media types
``helm push`` gives a chart: its Chart.yaml as the config, the chart's archive (``helm
package``'s) as the one layer. Gardener's puller (pkg/utils/oci) takes the layer of that type
and nothing else. The bytes depend on the charts' files alone, so a rebuild of unchanged charts
has the same digest."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import yaml

from image import version

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = ROOT / "build" / "charts"
CHARTS = {
    "dwd-lease-extension": ROOT / "manifests" / "gardener" / "extension" / "chart",
    "dwd-lease-admission": ROOT / "manifests" / "gardener" / "admission" / "chart",
}
CONFIG_TYPE = "application/vnd.cncf.helm.config.v1+json"
LAYER_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def archive(chart: Path) -> bytes:
    """The chart directory as ``helm package`` archives it and a ControllerDeployment's
    ``helm.rawChart`` carries it: a gzipped tar whose one top-level directory is the chart's.
    Its bytes depend on the files alone (no times, owners or order of the file system)."""
    buffer = io.BytesIO()
    # gzip's header holds a time (the clock's, unless given) and a file name.
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(p for p in chart.rglob("*") if p.is_file()):
            _add(tar, f"{chart.name}/{path.relative_to(chart).as_posix()}", path.read_bytes())
    return buffer.getvalue()


def artifact(chart: Path, tag: str) -> bytes:
    """``chart`` as an OCI layout in a tar, its one manifest tagged ``tag``."""
    metadata = yaml.safe_load((chart / "Chart.yaml").read_text())
    blobs: dict[str, bytes] = {}
    config = _blob(blobs, CONFIG_TYPE, json.dumps(metadata, sort_keys=True).encode())
    layer = _blob(blobs, LAYER_TYPE, archive(chart))
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config, "layers": [layer]}
    entry = _blob(blobs, MANIFEST_TYPE, json.dumps(manifest, sort_keys=True).encode())
    tagged = {**entry, "annotations": {REF_NAME: tag}}
    index = {"schemaVersion": 2, "manifests": [tagged]}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add(tar, "index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in sorted(blobs.items()):
            _add(tar, f"blobs/sha256/{digest}", data)
    return buffer.getvalue()


def build(directory: Path = BUILD_DIR) -> dict[str, Path]:
    """Both charts' artifacts under ``directory``, by name, tagged with the release (VERSION)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, chart in CHARTS.items():
        out[name] = directory / f"{name}.oci.tar"
        out[name].write_bytes(artifact(chart, version.current()))
    return out


def _blob(blobs: dict[str, bytes], media_type: str, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))

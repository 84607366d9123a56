"""The charts as archives and as Helm's OCI artifacts (image/charts.py). That Gardener's own
puller takes the artifacts, and its renderer the charts in them, is tests/integration/
test_garden.py's."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from image import charts


def _chart(root: Path) -> Path:
    chart = root / "dwd-lease"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: dwd-lease\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text("kind: ConfigMap\n")
    return chart


def test_the_chart_archive_is_the_chart_under_its_own_name(tmp_path: Path) -> None:
    archive = charts.archive(_chart(tmp_path))
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        names = tar.getnames()
        cm = tar.extractfile("dwd-lease/templates/cm.yaml")
        assert cm is not None and cm.read() == b"kind: ConfigMap\n"
    assert names == ["dwd-lease/Chart.yaml", "dwd-lease/templates/cm.yaml"]


def test_the_chart_archive_depends_on_the_files_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the files' times nor the clock's: gzip writes the time it compresses at into its
    header unless told one (a checked-in registration carries the archive)."""
    chart = _chart(tmp_path)
    before = charts.archive(chart)
    os.utime(chart / "Chart.yaml", (1, 1))
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)
    assert charts.archive(chart) == before
    (chart / "templates" / "cm.yaml").write_text("kind: Secret\n")
    assert charts.archive(chart) != before


def _layout(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: f.read() for m in tar.getmembers() if (f := tar.extractfile(m)) is not None}


def _blob(files: dict[str, bytes], descriptor: dict[str, Any]) -> bytes:
    data = files["blobs/sha256/" + descriptor["digest"].removeprefix("sha256:")]
    assert hashlib.sha256(data).hexdigest() == descriptor["digest"].removeprefix("sha256:")
    assert len(data) == descriptor["size"]
    return data


def test_the_artifact_is_a_layout_of_one_chart_tagged(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    files = _layout(charts.artifact(chart, "1.2.3"))
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"] == {charts.REF_NAME: "1.2.3"}
    manifest = json.loads(_blob(files, entry))
    assert manifest["config"]["mediaType"] == charts.CONFIG_TYPE
    assert json.loads(_blob(files, manifest["config"]))["name"] == "dwd-lease"
    [layer] = manifest["layers"]
    assert layer["mediaType"] == charts.LAYER_TYPE
    assert _blob(files, layer) == charts.archive(chart)


def test_unchanged_charts_make_the_same_artifact(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    before = charts.artifact(chart, "1.2.3")
    os.utime(chart / "Chart.yaml", (1, 1))
    assert charts.artifact(chart, "1.2.3") == before


def test_both_charts_are_built_and_each_carries_its_own_chart(tmp_path: Path) -> None:
    built = charts.build(tmp_path)
    assert sorted(built) == sorted(charts.CHARTS)
    for name, path in built.items():
        files = _layout(path.read_bytes())
        [entry] = json.loads(files["index.json"])["manifests"]
        [layer] = json.loads(_blob(files, entry))["layers"]
        assert _blob(files, layer) == charts.archive(charts.CHARTS[name])

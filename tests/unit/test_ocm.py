"""The OCM component descriptor (image/ocm.py): .ocm/component.yaml rendered with the release,
the commit and each image pinned by its digest; an archive's digest is its index's."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from image import ocm, version


def oci_archive(path: Path, manifests: list[dict[str, str]]) -> Path:
    with tarfile.open(path, "w") as tar:
        data = json.dumps({"schemaVersion": 2, "manifests": manifests}).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_each_image_is_named_by_the_release_and_pinned_by_its_digest(tmp_path: Path) -> None:
    digests = {
        name: "sha256:" + hashlib.sha256(name.encode()).hexdigest()
        for name in ("dwd-lease-agent", "dwd-lease-aggregator")
    }
    archives = {
        name: oci_archive(
            tmp_path / f"{name}.tar", [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": d}]
        )
        for name, d in digests.items()
    }
    release = version.current()
    doc = yaml.safe_load(
        ocm.write(tmp_path, release, "0123abc", "https://example/dwd-lease", archives).read_text()
    )
    component = doc["component"]
    assert doc["meta"] == {"schemaVersion": "v2"} and component["version"] == release
    assert component["sources"][0]["access"] == {
        "type": "gitHub",
        "repoUrl": "https://example/dwd-lease",
        "commit": "0123abc",
    }
    for resource in component["resources"]:
        digest = digests[resource["name"]]
        assert resource["version"] == release
        assert resource["access"]["imageReference"] == f"{resource['name']}:{release}@{digest}"
        assert resource["digest"]["value"] == digest.removeprefix("sha256:")
    assert {r["name"] for r in component["resources"]} == set(digests)


def test_an_archive_of_more_than_one_index_or_a_bad_digest_is_refused(tmp_path: Path) -> None:
    two = oci_archive(
        tmp_path / "two.tar", [{"digest": "sha256:" + "0" * 64}, {"digest": "sha256:" + "1" * 64}]
    )
    with pytest.raises(ValueError, match="2 manifests"):
        ocm.index_digest(two)
    with pytest.raises(ValueError, match="not a sha256 digest"):
        ocm.render(
            "0.3.0", "c", "r", {"dwd-lease-agent": "md5:00", "dwd-lease-aggregator": "sha256:" + "0" * 64}
        )

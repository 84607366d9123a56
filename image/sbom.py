"""An SPDX 2.3 document of an image's root filesystem: the Debian packages dpkg's status in it
lists (image/slim.py keeps the entries of the packages whose files the image holds) and the
Python distributions of its virtualenv, each with its package URL, so that a scanner or an
auditor reads what the image carries without unpacking it.

Written beside each archive as ``<name>.spdx.json`` (``<name>-arm64.spdx.json`` for the twin);
made from the image's own files, nothing else, so the same image gives the same document.
"""

from __future__ import annotations

import email.parser
import hashlib
import re
from pathlib import Path
from typing import Any

from image import slim

SITE_PACKAGES = "opt/dwd-lease/lib/python3*/site-packages"


def debian_packages(rootfs: Path) -> list[dict[str, str]]:
    """Name, version and architecture of every package the image's dpkg status lists."""
    path = rootfs / slim.DPKG_STATUS
    if not path.exists():
        return []
    stanzas = slim.dpkg_stanzas(path.read_text())
    fields = [slim.dpkg_fields(stanzas[name]) for name in sorted(stanzas)]
    return [{"name": f["Package"], "version": f["Version"], "arch": f["Architecture"]} for f in fields]


def python_distributions(rootfs: Path) -> list[dict[str, str]]:
    """Name and version of every distribution installed in the image's virtualenv."""
    found = []
    for metadata in sorted(rootfs.glob(f"{SITE_PACKAGES}/*.dist-info/METADATA")):
        headers = email.parser.HeaderParser().parsestr(metadata.read_text(errors="replace"))
        found.append({"name": str(headers["Name"]), "version": str(headers["Version"])})
    return sorted(found, key=lambda p: p["name"].lower())


def _spdx_id(kind: str, name: str) -> str:
    return f"SPDXRef-{kind}-" + re.sub(r"[^A-Za-z0-9.-]", "-", name)


def document(rootfs: Path, image: str, version: str, arch: str, created: str) -> dict[str, Any]:
    """The SPDX document of ``rootfs``, the image ``image`` at ``version`` for ``arch``;
    ``created`` is the document's time (the image's own, so that it is reproducible)."""
    debs, dists = debian_packages(rootfs), python_distributions(rootfs)
    packages: list[dict[str, Any]] = [
        {
            "name": image,
            "SPDXID": "SPDXRef-image",
            "versionInfo": version,
            "downloadLocation": "NOASSERTION",
            "primaryPackagePurpose": "CONTAINER",
        }
    ]
    for p in debs:
        purl = f"pkg:deb/debian/{p['name']}@{p['version']}?arch={p['arch']}&distro=debian-12"
        packages.append(_package(_spdx_id("deb", p["name"]), p["name"], p["version"], purl))
    for p in dists:
        purl = f"pkg:pypi/{p['name'].lower().replace('_', '-')}@{p['version']}"
        packages.append(_package(_spdx_id("pypi", p["name"]), p["name"], p["version"], purl))
    contents = "".join(sorted(f"{p['name']}@{p.get('versionInfo', '')}\n" for p in packages))
    digest = hashlib.sha256(f"{image} {version} {arch}\n{contents}".encode()).hexdigest()[:16]
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image}-{version}-{arch}",
        "documentNamespace": f"https://github.com/dwd-lease/spdx/{image}-{version}-{arch}-{digest}",
        "creationInfo": {"created": created, "creators": ["Tool: dwd-lease image/sbom.py"]},
        "packages": packages,
        "relationships": [
            _relationship("SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-image"),
            *(_relationship("SPDXRef-image", "CONTAINS", p["SPDXID"]) for p in packages[1:]),
        ],
    }


def _relationship(element: str, kind: str, related: str) -> dict[str, str]:
    return {"spdxElementId": element, "relationshipType": kind, "relatedSpdxElement": related}


def _package(spdx_id: str, name: str, version: str, purl: str) -> dict[str, Any]:
    return {
        "name": name,
        "SPDXID": spdx_id,
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "externalRefs": [
            {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}
        ],
    }

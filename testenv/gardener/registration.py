"""The extension's registration in the garden (manifests/gardener/extension/
controller-registration.yaml): a ControllerDeployment carrying the chart as gardenlet reads it
(``helm.rawChart``, the archive ``helm package`` makes, base64) and the ControllerRegistration
of the Extension type, made from the chart by ``make manifests``. A test checks the file holds
the chart as it is now (``contents``: by its files, since gzip's bytes may differ between zlib
builds where the files do not)."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path
from typing import Any

import yaml

from testenv.gardener.gardener_types import chart_archive

CHART = "manifests/gardener/extension/chart"
TARGET = "manifests/gardener/extension/controller-registration.yaml"
# gardenlet renders the chart as a release of this name (the ControllerRegistration's).
NAME = "dwd-lease"

TEMPLATE = """\
# Apply to the garden cluster (docs/install.md, "Installing in a Gardener landscape").
---
apiVersion: core.gardener.cloud/v1
kind: ControllerDeployment
metadata:
  name: {name}
helm:
  # The chart ({chart}), as `helm package` archives it, base64.
  rawChart: {raw_chart}
  # Yours to set (the chart's values.yaml says what else): the image in your registry, and
  # dryRun false once the dry run has been watched (docs/install.md, "Rolling out safely").
  values:
    image: {image}
    dryRun: {dry_run}
---
apiVersion: core.gardener.cloud/v1beta1
kind: ControllerRegistration
metadata:
  name: {name}
  annotations:
    # gardenlet enforces it on the extension's namespace: the aggregator's pods meet it.
    security.gardener.cloud/pod-security-enforce: restricted
spec:
  resources:
    - kind: Extension
      type: {type}
      # Every shoot has it; one opts out by spec.extensions [{{type: {type}, disabled: true}}].
      autoEnable: ["shoot"]
      # A shoot without workers has no nodes to judge and no controllers to hold down.
      workerlessSupported: false
      # Gardener's defaults for an Extension, said: reconciled once the shoot's API server is up
      # (the agents' objects go there), deleted and migrated before it goes.
      lifecycle:
        reconcile: AfterKubeAPIServer
        delete: BeforeKubeAPIServer
        migrate: BeforeKubeAPIServer
  deployment:
    # Installed on a seed while one of its shoots has the extension.
    policy: OnDemand
    deploymentRefs:
      - name: {name}
"""


def render(chart: Path) -> str:
    """The registration of ``chart`` (its defaults for the image, the dry run and the type)."""
    values = yaml.safe_load((chart / "values.yaml").read_text())
    return TEMPLATE.format(
        name=NAME,
        chart=CHART,
        raw_chart=base64.b64encode(chart_archive(chart)).decode(),
        image=values["image"],
        dry_run=str(values["dryRun"]).lower(),
        type=values["extensionType"],
    )


def archive_files(raw_chart: str) -> dict[str, bytes]:
    """A ``helm.rawChart``'s files by their path in the archive."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(raw_chart)), mode="r:gz") as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member)
            if data is not None:
                files[member.name] = data.read()
    return files


def contents(text: str) -> list[dict[str, Any]]:
    """What a registration says: its objects, the chart by its files."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        helm = doc.get("helm") or {}
        if "rawChart" in helm:
            doc["helm"] = {**helm, "rawChart": archive_files(helm["rawChart"])}
    return docs

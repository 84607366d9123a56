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

from image import version
from image.charts import archive

CHART = "manifests/gardener/extension/chart"
TARGET = "manifests/gardener/extension/controller-registration.yaml"
# gardenlet renders the chart as a release of this name (the ControllerRegistration's).
NAME = "dwd-lease"

# The Extension type, as both registrations declare it.
RESOURCES = """\
  resources:
    - kind: Extension
      type: {type}
      # Every shoot has it; one opts out by spec.extensions [{{type: {type}, disabled: true}}].
      autoEnable: ["shoot"]
      # Of shoots only (no seed, no garden). gardener-operator's defaulting would set it; its
      # validation refuses autoEnable without it.
      clusterCompatibility: ["shoot"]
      # A shoot without workers has no nodes to judge and no controllers to hold down.
      workerlessSupported: false
      # Gardener's defaults for an Extension, said: reconciled once the shoot's API server is up
      # (the agents' objects go there), deleted and migrated before it goes.
      lifecycle:
        reconcile: AfterKubeAPIServer
        delete: BeforeKubeAPIServer
        migrate: BeforeKubeAPIServer
"""

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
{resources}  deployment:
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
        raw_chart=base64.b64encode(archive(chart)).decode(),
        image=values["image"],
        dry_run=str(values["dryRun"]).lower(),
        resources=RESOURCES.format(type=values["extensionType"]),
    )


# The second way: for gardener-operator, which pulls both charts (image/charts.py) and makes the
# ControllerRegistration and ControllerDeployment from it (copying the annotation over).
OPERATOR_TARGET = "manifests/gardener/operator/extension.yaml"
ADMISSION_CHART = "manifests/gardener/admission/chart"
# aggregator/model/door.py's policy and binding (make manifests).
DOOR = "manifests/gardener/garden/admission-policy.yaml"
OPERATOR_TEMPLATE = """\
# Apply to the garden's runtime cluster, where gardener-operator runs (docs/install.md,
# "Installing in a Gardener landscape"), once `make image` has built both charts' artifacts
# (build/charts/) and you have copied them to your registry.
---
apiVersion: operator.gardener.cloud/v1alpha1
kind: Extension
metadata:
  name: {name}
  annotations:
    # gardenlet enforces it on the extension's namespace: the aggregator's pods meet it.
    security.gardener.cloud/pod-security-enforce: restricted
spec:
{resources}\
  deployment:
    extension:
      helm:
        ociRepository:
          # Yours to set: where you copied build/charts/dwd-lease-extension.oci.tar.
          ref: {registry}/dwd-lease-extension:{release}
      # As in the ControllerDeployment (../extension/controller-registration.yaml).
      values:
        image: {image}
        dryRun: {dry_run}
      # Installed on a seed while one of its shoots has the extension.
      policy: OnDemand
    admission:
      # The door: a CEL policy gardener-apiserver evaluates, nothing to run in the runtime cluster.
      virtualCluster:
        helm:
          ociRepository:
            # Yours to set: where you copied build/charts/dwd-lease-admission.oci.tar.
            ref: {registry}/dwd-lease-admission:{release}
"""
REGISTRY = "registry.example.com/gardener/extensions"


def render_operator(chart: Path) -> str:
    """The operator's Extension of ``chart`` and the admission chart, both tagged with the
    release."""
    values = yaml.safe_load((chart / "values.yaml").read_text())
    return OPERATOR_TEMPLATE.format(
        name=NAME,
        resources=RESOURCES.format(type=values["extensionType"]),
        registry=REGISTRY,
        release=version.current(),
        image=values["image"],
        dry_run=str(values["dryRun"]).lower(),
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

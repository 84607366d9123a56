"""The reference our kubeconfig readers are compared with (testenv/base/kubeconfig_probe.py) is the
client-go the pinned Kubernetes release is built with."""

from __future__ import annotations

import re

import pytest

from testenv.base import binaries


@pytest.mark.parametrize("module", ["k8s.io/client-go", "k8s.io/apimachinery"])
def test_the_kubeconfig_probe_is_client_go_of_the_pinned_kubernetes_release(module: str) -> None:
    """The kubelet of the release under test loads its kubeconfig with this client-go, and the
    probe's build finds every module in the cache kube-apiserver's build filled (seconds, no
    fetch)."""
    kubernetes = (binaries.KUBE_APISERVER.module_dir / "go.mod").read_text()
    probe = (binaries.KUBECONFIG_PROBE.module_dir / "go.mod").read_text()
    pinned = re.search(rf"^\s*{re.escape(module)} => {re.escape(module)} (v\S+)", kubernetes, re.M)
    used = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", probe, re.M)
    assert pinned is not None and used is not None
    assert used.group(1) == pinned.group(1)

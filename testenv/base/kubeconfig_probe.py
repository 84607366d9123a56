"""What client-go makes of a kubeconfig: the reference our two kubeconfig readers are compared with
(tests/integration/test_kubeconfig_clientgo.py).

The probe (testenv/go/kubeconfig-probe/main.go) loads each file with client-go at the pinned
Kubernetes release, as the kubelet loads its kubeconfig (``file``) or as a kubeconfig from a Secret
is loaded (``bytes``), and answers with the rest.Config fields that say where and how to connect,
or client-go's error. It runs with an empty environment: ``KUBERNETES_MASTER`` or the in-cluster
variables would change what client-go falls back to.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from testenv.base import binaries

PROBE = binaries.KUBECONFIG_PROBE
Mode = Literal["file", "bytes"]


def build(*, log: TextIO = sys.stderr) -> Path:
    """Built unless cached (seconds, from the module cache kube-apiserver's build filled)."""
    return binaries.build(only=(PROBE,), log=log)[PROBE.name]


def load(entries: Sequence[tuple[Mode, Path]], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """client-go's reading of each (mode, file), from one run of the probe."""
    done = subprocess.run(
        [str(build())],
        input=json.dumps([{"mode": mode, "path": str(path)} for mode, path in entries]),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{PROBE.name} exited {done.returncode}: {done.stderr.strip()}")
    results: list[dict[str, Any]] = json.loads(done.stdout)
    if len(results) != len(entries):
        raise RuntimeError(f"{PROBE.name} answered {len(results)} for {len(entries)} kubeconfigs")
    return results

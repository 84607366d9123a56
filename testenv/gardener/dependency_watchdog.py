"""The real gardener/dependency-watchdog (DWD) of a pinned release, built from the Go module proxy
and started as its prober (``dependency-watchdog prober``) against a test seed: its Cluster
controller decides from each Cluster's embedded Shoot whether that shoot has a prober.

testenv/gardener/prober_standin.py is a stand-in of what one prober does; this is the real program, for what
its controller decides: which Clusters get a prober (``Starting a new prober`` in its log) and which
lose theirs (``Existing prober has been removed``, ``Cluster not found, existing prober has been
removed``). Its probers are configured never to probe within a test (``IDLE``): they would need
a shoot's kubeconfig Secret in every namespace and would scale its Deployments.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from core.errors import NotFound, TooManyRequests
from testenv.base import binaries
from testenv.base.kapi import Client
from testenv.base.process import Process, spawn
from testenv.base.wait import wait_for
from testenv.gardener.apply import apply
from testenv.gardener.grm import embedded_kubeconfig
from testenv.gardener.seed_objects import (
    CLUSTER_CRD,
    CLUSTERS_PATH,
    LAST_OPERATION_STATES,
    LAST_OPERATION_TYPES,
    MACHINE_CRD,
)
from testenv.kube.controlplane import ControlPlane, free_port

VERSION = "v1.7.0"
MODULE = "github.com/gardener/dependency-watchdog"
NAME = "dependency-watchdog"
CONTROLLER = "cluster"
STARTED = "Starting a new prober"
REMOVED = ("Existing prober has been removed", "Cluster not found, existing prober has been removed")
# A prober started in a test waits a day before its first probe: it exists, and does nothing.
IDLE = "24h"


@dataclass(frozen=True)
class ShootState:
    """The fields of a Cluster's Shoot that DWD's cluster controller decides on
    (``shouldStopProber``, ``canStartProber``, the worker-less predicate), under
    ``testenv.gardener.seed_objects.cluster``'s names."""

    deleting: bool
    hibernation: bool | None
    hibernated: bool
    workers: int
    last_operation: tuple[str, str] | None

    def fields(self) -> dict[str, Any]:
        """``testenv.gardener.seed_objects.cluster``'s keyword arguments for it."""
        return {
            "deleting": self.deleting,
            "hibernation": self.hibernation,
            "hibernated": self.hibernated,
            "workers": self.workers,
            "last_operation": self.last_operation,
        }


def shoot_states(hibernation: tuple[bool | None, ...] = (True, False)) -> list[ShootState]:
    """Every combination of those fields' values: deleting or not, hibernation enabled or not
    (or unset, if asked), hibernated or not, no worker pool or one, and no last operation or
    each operation type in each state (496 with the default)."""
    operations: list[tuple[str, str] | None] = [None]
    operations += list(itertools.product(LAST_OPERATION_TYPES, LAST_OPERATION_STATES))
    return [
        ShootState(*values)
        for values in itertools.product((False, True), hibernation, (False, True), (0, 1), operations)
    ]


def cache_dir() -> Path:
    return binaries.module_cache_dir(NAME, MODULE, VERSION)


def binary_path() -> Path:
    return cache_dir() / NAME


def build(*, force: bool = False, log: TextIO = sys.stderr) -> Path:
    """Build DWD from its own module tree unless it is cached; returns the binary."""
    with binaries.building(NAME):
        return _build(force=force, log=log)


def _build(*, force: bool, log: TextIO) -> Path:
    target = binary_path()
    if target.exists() and not force:
        return target
    started = time.monotonic()
    print(f"testenv: building {NAME} {VERSION} (cold builds take minutes)", file=log, flush=True)
    with tempfile.TemporaryDirectory(prefix="dwd-dependency-watchdog-build-") as tmp:
        src = binaries.module_tree(MODULE, VERSION, Path(tmp) / "src")
        built = Path(tmp) / NAME
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(built), "."],
            cwd=src,
            env=binaries.go_build_env(),
            check=True,
        )
        binaries.install(built, target)
    print(f"testenv: built {NAME} in {time.monotonic() - started:.0f}s -> {target}", file=log, flush=True)
    return target


def find() -> Path:
    binaries.wait_for_build(NAME)
    if not binary_path().exists():
        raise FileNotFoundError(f"{NAME} {VERSION} not built in {cache_dir()}: run `make testenv`")
    return binary_path()


def prober_config() -> dict[str, Any]:
    """A valid prober configuration (DWD refuses to start without dependents) whose probers
    never probe within a test."""
    step = {"level": 0, "initialDelay": "0s", "timeout": "30s"}
    return {
        "kubeConfigSecretName": "dwd-lease-unused",
        "probeInterval": IDLE,
        "initialDelay": IDLE,
        "dependentResourceInfos": [
            {
                "ref": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "kube-controller-manager"},
                "optional": True,
                "scaleUp": step,
                "scaleDown": step,
            }
        ],
    }


def ensure_crds(admin: Client, timeout_s: float = 30.0) -> None:
    """The CRDs its prober command watches (Clusters) or reads (Machines), served."""
    apply(admin, [CLUSTER_CRD, MACHINE_CRD])

    def served() -> bool:
        try:
            admin.get(CLUSTERS_PATH, limit="1")
            admin.get("/apis/machine.sapcloud.io/v1alpha1/machines", limit="1")
        except (NotFound, TooManyRequests):  # 429: a new CRD's storage is still initialising
            return False
        return True

    wait_for(served, timeout_s, "the Cluster and Machine CRDs served")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(text: str, name: str, /, **labels: str) -> float:
    """The sum of the samples of ``name`` (Prometheus' text format) that carry ``labels`` (one
    may be called ``name``: the workqueue's are)."""
    out = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            have = dict(_LABEL.findall(m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                out += float(m.group(3))
    return out


@dataclass
class DependencyWatchdog:
    """DWD's prober command watching ``seed``'s Clusters, its JSON log in ``workdir``."""

    seed: ControlPlane
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwd-real-")))
    # Its default, and the only safe value: v1.7.0's prober manager reads its map of probers
    # without its lock (GetProber, internal/prober/probermgr.go), and two reconciles at once
    # end it with "fatal error: concurrent map read and map write" (seen at 4, 165 Clusters in).
    concurrent_reconciles: int = 1
    proc: Process | None = None
    metrics_port: int = 0

    def start(self, timeout_s: float = 60.0) -> DependencyWatchdog:
        binary = find()
        with self.seed.admin_client() as admin:
            ensure_crds(admin)
        self.workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.workdir / "seed.kubeconfig"
        kubeconfig.write_text(embedded_kubeconfig(self.seed))
        config = self.workdir / "prober-config.yaml"
        config.write_text(yaml.safe_dump(prober_config()))
        self.metrics_port = free_port()
        argv = [
            str(binary),
            "prober",
            f"--config-file={config}",
            f"--kubeconfig={kubeconfig}",
            "--enable-leader-election=false",
            f"--concurrent-reconciles={self.concurrent_reconciles}",
            # Its help calls them --*-bind-address; the flags are --*-bind-addr. 0: not served.
            f"--metrics-bind-addr=127.0.0.1:{self.metrics_port}",
            "--health-bind-addr=0",
            "--pprof-bind-addr=0",
            # Every line: at its own level (debug) controller-runtime's zap samples, keeping 100
            # lines of one message a second and then every 100th, and a thousand Clusters'
            # "Starting a new prober" would mostly be missing. At V(2) it does not sample.
            "--zap-log-level=2",
        ]
        # A clean environment: KUBECONFIG would not win over the flag, but nothing else may leak in.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir)}
        self.proc = spawn(NAME, argv, log_path=self.workdir / f"{NAME}.log", env=env, die_with_parent=True)
        wait_for(self._working, timeout_s, f"{NAME}'s cluster controller working (log: {self.proc.log_path})")
        return self

    def _working(self) -> bool:
        assert self.proc is not None
        if not self.proc.alive():
            raise RuntimeError(f"{NAME} exited {self.proc.popen.returncode}:\n{self.proc.tail(30)}")
        workers = any(
            e.get("msg") == "Starting workers" and e.get("controller") == CONTROLLER for e in self._log()
        )
        return workers and self.metrics_text() != ""

    def _log(self) -> list[dict[str, Any]]:
        assert self.proc is not None
        return self.proc.events()

    def metrics_text(self) -> str:
        """Its /metrics ("" while it does not answer)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())
        return ""

    def reconciles(self, text: str | None = None) -> int:
        """How many reconciles of Clusters it has finished (every result)."""
        text = self.metrics_text() if text is None else text
        return int(metric(text, "controller_runtime_reconcile_total", controller=CONTROLLER))

    def idle(self) -> bool:
        """Nothing queued and no reconcile running: every event it has seen is reconciled."""
        text = self.metrics_text()
        if not text:
            return False
        queued = metric(text, "workqueue_depth", name=CONTROLLER)
        active = metric(text, "controller_runtime_active_workers", controller=CONTROLLER)
        return queued == 0 and active == 0

    def prober_events(self) -> list[tuple[str, str]]:
        """(Cluster name, "started" or "removed"), in the order its log has them."""
        out = []
        for e in self._log():
            if e.get("controller") != CONTROLLER or not isinstance(e.get("name"), str):
                continue
            if e.get("msg") == STARTED:
                out.append((e["name"], "started"))
            elif e.get("msg") in REMOVED:
                out.append((e["name"], "removed"))
        return out

    def probers(self) -> set[str]:
        """The Clusters it has a prober for now: started and not removed since."""
        out: set[str] = set()
        for name, what in self.prober_events():
            if what == "started":
                out.add(name)
            else:
                out.discard(name)
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @contextlib.contextmanager
    def running(self) -> Iterator[DependencyWatchdog]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

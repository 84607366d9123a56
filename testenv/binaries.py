"""Build kube-apiserver, kube-controller-manager, etcd and kustomize from the Go module
proxy into a version-keyed cache.

The wrapper modules under ``go/`` pin the releases; the cache directory name is
derived from those pins and the Go toolchain, so a warm cache makes a build a
no-op and a changed pin can never pick up a stale binary.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

GO_DIR = Path(__file__).resolve().parent / "go"


@dataclass(frozen=True)
class Component:
    name: str
    module_dir: Path
    main_package: str
    pinned_module: str

    def version(self) -> str:
        text = (self.module_dir / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.pinned_module)}\s+(v\S+)", text, re.M)
        if match is None:
            raise RuntimeError(f"{self.module_dir}/go.mod does not require {self.pinned_module}")
        return match.group(1)

    def ldflags(self) -> str:
        if self.pinned_module != "k8s.io/kubernetes":
            return "-s -w"
        # Without the stamp /version reports v0.0.0-master+$Format:%H$.
        version = self.version()
        major, minor = version.lstrip("v").split(".")[:2]
        pkg = "k8s.io/component-base/version"
        return (
            f"-s -w -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} "
            f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
        )


KUBE_APISERVER = Component(
    "kube-apiserver", GO_DIR / "kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes"
)
# From the kube-apiserver's wrapper module: the same pinned release, the same replaces.
KUBE_CONTROLLER_MANAGER = Component(
    "kube-controller-manager",
    GO_DIR / "kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes",
)
ETCD = Component("etcd", GO_DIR / "etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3")
KUSTOMIZE = Component(
    "kustomize",
    GO_DIR / "kustomize",
    "sigs.k8s.io/kustomize/kustomize/v5",
    "sigs.k8s.io/kustomize/kustomize/v5",
)
COMPONENTS = (KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, ETCD, KUSTOMIZE)


def go_version() -> str:
    out = subprocess.run(["go", "env", "GOVERSION"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def cache_root() -> Path:
    explicit = os.environ.get("DWDDEV_TESTENV_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dwd-lease" / "testenv"


def cache_dir(component: Component) -> Path:
    """The directory for one component's exact pins (version, go.mod and go.sum content, Go)."""
    digest = hashlib.sha256()
    digest.update((component.module_dir / "go.mod").read_bytes())
    digest.update((component.module_dir / "go.sum").read_bytes())
    digest.update(go_version().encode())
    return cache_root() / f"{component.name}-{component.version()}-{digest.hexdigest()[:12]}"


def binary_path(component: Component) -> Path:
    return cache_dir(component) / component.name


def build(
    *, force: bool = False, log: TextIO = sys.stderr, only: tuple[Component, ...] = COMPONENTS
) -> dict[str, Path]:
    """Build any missing binary (of ``only``); returns the path of each."""
    out: dict[str, Path] = {}
    for c in only:
        target = binary_path(c)
        target.parent.mkdir(parents=True, exist_ok=True)
        out[c.name] = target
        if target.exists() and not force:
            continue
        started = time.monotonic()
        print(f"testenv: building {c.name} {c.version()} (cold builds take minutes)", file=log, flush=True)
        tmp = target.with_suffix(".tmp")
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false")
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", c.ldflags(), "-o", str(tmp), c.main_package],
            cwd=c.module_dir,
            env=env,
            check=True,
        )
        # Rename last, so an interrupted build never leaves a half-written binary
        # under the final name.
        tmp.replace(target)
        print(
            f"testenv: built {c.name} in {time.monotonic() - started:.0f}s -> {target}", file=log, flush=True
        )
    return out


def find(only: tuple[Component, ...] = COMPONENTS) -> dict[str, Path]:
    """The cached binaries, or a clear error that says how to build them."""
    found = {c.name: binary_path(c) for c in only}
    missing = [name for name, path in found.items() if not path.exists()]
    if missing:
        raise FileNotFoundError(
            f"testenv binaries {', '.join(missing)} not built in {cache_root()}: run `make testenv`"
        )
    return found

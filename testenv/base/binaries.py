"""Build kube-apiserver, kube-controller-manager, kubemark, etcd, kustomize and our kubeconfig probe
from the Go module proxy into a version-keyed cache.

The wrapper modules under ``go/`` pin the releases; the cache directory name is
derived from those pins and the Go toolchain, so a warm cache makes a build a
no-op and a changed pin can never pick up a stale binary. Programs built from a
release's own module tree (gardener-resource-manager, dependency-watchdog) share
``module_tree``, ``module_cache_dir`` and ``install`` from here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from image import lockfile
from testenv.base.progress import Progress, StepFailed, run_logged

GO_DIR = Path(__file__).resolve().parents[1] / "go"


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
# The kubelet's own code as a hollow node (testenv/kube/hollow.py), from the same module too.
KUBEMARK = Component(
    "kubemark", GO_DIR / "kube-apiserver", "k8s.io/kubernetes/cmd/kubemark", "k8s.io/kubernetes"
)
ETCD = Component("etcd", GO_DIR / "etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3")
KUSTOMIZE = Component(
    "kustomize",
    GO_DIR / "kustomize",
    "sigs.k8s.io/kustomize/kustomize/v5",
    "sigs.k8s.io/kustomize/kustomize/v5",
)
# What client-go makes of a kubeconfig (testenv/base/kubeconfig_probe.py): client-go at kube-apiserver's
# release, compiled from the modules its build fetched.
KUBECONFIG_PROBE = Component(
    "kubeconfig-probe",
    GO_DIR / "kubeconfig-probe",
    "dwd-lease/testenv/kubeconfig-probe",
    "k8s.io/client-go",
)
COMPONENTS = (KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, KUBEMARK, ETCD, KUSTOMIZE, KUBECONFIG_PROBE)
# The ones built in kube-apiserver's go build, and what ``make demo`` runs (those and etcd).
KUBERNETES = (KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, KUBEMARK)
DEMO = (*KUBERNETES, ETCD)


@dataclass(frozen=True)
class Flavor:
    """How the compiler treats a build: the tests run the optimized binaries; a cold ``make
    demo`` builds them without the compiler's optimizations and inlining (``quick``), the same
    code compiled in less time, in a cache of its own so that neither is taken for the other."""

    suffix: str
    gcflags: str


OPTIMIZED = Flavor("", "all=-dwarf=false")
QUICK = Flavor("-quick", "all=-N -l -dwarf=false")


def go_version() -> str:
    out = subprocess.run(["go", "env", "GOVERSION"], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def cache_root() -> Path:
    explicit = os.environ.get("DWDDEV_TESTENV_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dwd-lease" / "testenv"


def cache_dir(component: Component, flavor: Flavor = OPTIMIZED) -> Path:
    """The directory for one component's exact pins (version, go.mod and go.sum content, Go)
    and the flavor of its build."""
    digest = hashlib.sha256()
    digest.update((component.module_dir / "go.mod").read_bytes())
    digest.update((component.module_dir / "go.sum").read_bytes())
    digest.update(go_version().encode())
    name = f"{component.name}-{component.version()}-{digest.hexdigest()[:12]}{flavor.suffix}"
    return cache_root() / name


@contextlib.contextmanager
def building(name: str) -> Iterator[None]:
    """Held while ``name`` builds (a lock file in the cache): a test that needs it meanwhile
    waits for it (``wait_for_build``) instead of failing, and a second build of it waits and
    then finds it built. `make test` starts its clock-bound tests while the builds they do not
    need first go on."""
    with lockfile.held(cache_root() / f".{name}.building"):
        yield


def wait_for_build(name: str, timeout_s: float = 3600) -> None:
    """Returns at once unless ``name`` is being built; then when its build has ended."""
    lockfile.wait_until_free(cache_root() / f".{name}.building", name, timeout_s)


def binary_path(component: Component, flavor: Flavor = OPTIMIZED) -> Path:
    return cache_dir(component, flavor) / component.name


def build(
    *,
    force: bool = False,
    log: TextIO = sys.stderr,
    only: tuple[Component, ...] = COMPONENTS,
    flavor: Flavor = OPTIMIZED,
    progress: Progress | None = None,
) -> dict[str, Path]:
    """Build any missing binary (of ``only``); returns the path of each. The missing ones of
    one wrapper module go in one ``go build``: its packages are loaded once and the binaries
    link side by side (kube-controller-manager cost 103 s after kube-apiserver on its own).
    Each module's fetch and build are steps of ``progress`` (one of its own on ``log`` if none)."""
    out = {c.name: binary_path(c, flavor) for c in only}
    for module_dir in dict.fromkeys(c.module_dir for c in only):
        with building(module_dir.name):
            missing = [c for c in only if c.module_dir == module_dir and (force or not out[c.name].exists())]
            if missing:
                progress = progress or Progress(steps(only, flavor, force=force), log)
                _build_together(missing, flavor, progress)
    return out


def steps(only: tuple[Component, ...], flavor: Flavor, *, force: bool = False) -> int:
    """How many steps ``build`` takes: its modules' fetch and build, for each with a binary
    missing (another process may build one meanwhile: then fewer)."""
    missing = {c.module_dir for c in only if force or not binary_path(c, flavor).exists()}
    return 2 * len(missing)


def build_log(module_dir: Path, flavor: Flavor) -> Path:
    """Where go's own output of a module's last build goes."""
    return cache_root() / "logs" / f"{module_dir.name}{flavor.suffix}.log"


def go_build_env() -> dict[str, str]:
    """The environment of every test binary's go build. The linker drops the debug info
    (-ldflags -w); the compiler is told not to write it in the first place, the same binary
    for about a fifth less compile time (kustomize cold: 28 s, 35 s with it). No workspace: a
    release's tree may carry its developers' go.work (gardener v1.149.3 does, with -mod=mod
    refused under it); its go.mod's replaces are what a build from the module needs."""
    return dict(
        os.environ,
        CGO_ENABLED="0",
        GOFLAGS="-mod=mod -buildvcs=false -gcflags=all=-dwarf=false",
        GOWORK="off",
    )


def module_cache_dir(name: str, module: str, version: str, *sources: Path) -> Path:
    """The cache directory of a program built from ``module@version``'s own tree: keyed by the
    release, the Go toolchain and the content of any ``sources`` of ours built into it."""
    digest = hashlib.sha256(f"{module}@{version} {go_version()}".encode())
    for source in sources:
        digest.update(source.read_bytes())
    return cache_root() / f"{name}-{version}-{digest.hexdigest()[:12]}"


def module_tree(module: str, version: str, into: Path) -> Path:
    """A writable copy of ``module@version`` from the module cache (fetched through the proxy
    if missing), at ``into``. Built in its own tree, not through a wrapper module: its go.mod
    carries the replace directives its build needs, and a wrapper would not inherit them.
    A module it nests and replaces by a path of its own (gardener from v1.14x: ``replace
    github.com/gardener/gardener/pkg/apis => ./pkg/apis``) is not in its zip: each is fetched
    at the same version and copied to that path."""
    found = _download(module, version)
    # The module cache is read-only, and go build writes go.sum entries beside go.mod.
    shutil.copytree(Path(found["Dir"]), into)
    for nested, path in nested_replaces((into / "go.mod").read_text()):
        if (into / path).exists():
            continue
        inner = _download(nested, version)
        if inner.get("Origin", {}).get("Hash") != found.get("Origin", {}).get("Hash"):
            raise RuntimeError(f"{nested}@{version} is not from {module}@{version}'s commit")
        shutil.copytree(Path(inner["Dir"]), into / path)
    for root, dirs, files in os.walk(into):
        for name in (*dirs, *files):
            child = Path(root) / name
            child.chmod(child.stat().st_mode | 0o200)
    return into


def nested_replaces(go_mod: str) -> list[tuple[str, str]]:
    """The ``replace MODULE => ./PATH`` directives of a go.mod (single-line ones, the form
    gardener writes): each module it builds from a directory of its own tree."""
    found = re.findall(r"^replace\s+(\S+)(?:\s+\S+)?\s+=>\s+(\./\S+)\s*$", go_mod, re.M)
    return [(module, path.removeprefix("./")) for module, path in found]


def _download(module: str, version: str) -> dict[str, Any]:
    """``go mod download -json`` of one module: its directory in the module cache, its origin."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        env=go_build_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def install(built: Path, target: Path) -> None:
    """``built`` to ``target``, renamed last: an interrupted build never leaves a half-written
    binary under the final name (a copy first: the build's temporary directory may be on
    another file system)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_suffix(".tmp")
    shutil.copyfile(built, staged)
    staged.chmod(0o755)
    staged.replace(target)


def _build_together(components: list[Component], flavor: Flavor, progress: Progress) -> None:
    """Two steps: the modules the packages need fetched (``go list -deps`` loads exactly what
    the build loads), then the build, each said as it starts and ends, go's own output (200
    lines of "go: downloading" cold, then minutes of nothing) in the module's log."""
    version = components[0].version()
    release = f"{components[0].pinned_module.split('/')[1]} {version}"
    names = _listed([c.name for c in components])
    quick = " (unoptimized)" if flavor == QUICK else ""
    log = build_log(components[0].module_dir, flavor)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")  # this build's alone
    env, cwd = go_build_env(), components[0].module_dir
    packages = [c.main_package for c in components]
    with progress.step(
        f"fetching Go modules for {release}", f"fetched Go modules for {release}", f" (go's output: {log})"
    ):
        run_logged(["go", "list", "-deps", *packages], log, cwd=cwd, env=env, stdout=False)
    with (
        progress.step(f"building {names} {version}{quick}", f"built {names} {version}{quick}"),
        tempfile.TemporaryDirectory(prefix="dwd-testenv-build-") as tmp,
    ):
        run_logged(
            [
                "go",
                "build",
                "-trimpath",
                # After GOFLAGS' -gcflags, so this one is the one applied.
                f"-gcflags={flavor.gcflags}",
                "-ldflags",
                # One module, one pinned release: the same version stamp for each.
                components[0].ldflags(),
                "-o",
                tmp + "/",
                *packages,
            ],
            log,
            cwd=cwd,
            env=env,
        )
        for c in components:
            install(Path(tmp) / _go_binary_name(c.main_package), binary_path(c, flavor))


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _go_binary_name(package: str) -> str:
    """What ``go build -o DIR/`` names a main package's binary: its last path element, the one
    before a major version suffix (go.etcd.io/etcd/server/v3 -> server)."""
    parts = package.split("/")
    return parts[-2] if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]) else parts[-1]


def build_side_by_side(
    groups: list[tuple[Component, ...]],
    *,
    force: bool = False,
    flavor: Flavor = OPTIMIZED,
    log: TextIO = sys.stderr,
) -> None:
    """Each group's ``build`` in a thread of its own, their steps numbered together: the first
    failure is raised once the others have finished."""
    progress = Progress(sum(steps(only, flavor, force=force) for only in groups), log)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(groups)) as pool:
        builds = [
            pool.submit(build, force=force, only=only, flavor=flavor, progress=progress) for only in groups
        ]
        for done in concurrent.futures.as_completed(builds):
            done.result()


def build_demo(*, force: bool = False, log: TextIO = sys.stderr) -> None:
    """What ``make demo`` runs, kube-apiserver's go build beside etcd's: nothing where the
    tests' optimized binaries are there, else the quick ones (270 s against 369 s from a warm
    module cache here, docs/measured.md)."""
    if not force and all(binary_path(c).exists() for c in DEMO):
        return
    build_side_by_side([KUBERNETES, (ETCD,)], force=force, flavor=QUICK, log=log)


def find(only: tuple[Component, ...] = COMPONENTS) -> dict[str, Path]:
    """The cached binaries, optimized where they are built, else quick (once any build of them
    under way has ended), or a clear error that says how to build them."""
    for module_dir in dict.fromkeys(c.module_dir for c in only):
        wait_for_build(module_dir.name)
    found = {c.name: _best(c) for c in only}
    missing = [name for name, path in found.items() if not path.exists()]
    if missing:
        raise FileNotFoundError(
            f"testenv binaries {', '.join(missing)} not built in {cache_root()}: run `make testenv`"
        )
    return found


def _best(component: Component) -> Path:
    optimized = binary_path(component)
    quick = binary_path(component, QUICK)
    return quick if not optimized.exists() and quick.exists() else optimized


if __name__ == "__main__":
    # ``python3 -m testenv.base.binaries``: what ``make demo`` runs, built with the standard library
    # alone, so that it starts before the venv exists and builds while pip installs (a cold
    # ``make demo`` paid pip's 40 s before the build's first second). A failed step says so and
    # shows the end of go's log, without a traceback through this module.
    try:
        build_demo()
    except StepFailed as e:
        print(f"testenv: {e}", file=sys.stderr)
        sys.exit(1)

"""Build the agent and aggregator images from the Containerfile, as OCI archives.

Both images are built by buildah with chroot isolation (no OCI runtime, no
cgroups needed) and saved under ``build/images/`` as ``<name>.oci.tar``. The
build base is either a registry image (``--base``: what the Containerfile
defaults to) or, by default, one made here from Debian's own packages with
mmdebstrap (python3, its venv module, ca-certificates, binutils), so a builder
without a registry (CI, an air-gapped machine) can build them. Neither image
has a base of its own: each is cut from its build stage to what it runs
(image/slim.py).

Each image also has an arm64 twin (image/arm64.py: the same cut, from Debian's arm64
packages and aarch64 wheels, nothing foreign run), and both go into one OCI index per
image, ``<name>.index.oci.tar``; ``<name>.oci.tar`` is the amd64 image alone, what this
machine runs.

The result is cached in ``~/.cache/dwd-lease/images/<key>/``, the key a hash of
every input (the Containerfile, the packages' sources, pyproject.toml, the
bases), so a warm machine, or a fresh clone on it, copies instead of building.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from image import arm64, lockfile, locks, ocm, sbom, version

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = ROOT / "build" / "images"
CACHE_DIR = Path(os.environ.get("DWDDEV_IMAGE_CACHE", Path.home() / ".cache" / "dwd-lease" / "images"))
TARGETS = ("agent", "aggregator")
# readelf and aarch64-linux-gnu-strip (binutils-aarch64-linux-gnu): the arm64 twins.
TOOLS = ("podman", "buildah", "runc", "skopeo", "mmdebstrap", "readelf", "aarch64-linux-gnu-strip")
# The inputs of the images besides the sources: a change to any of them is a new build.
INPUT_FILES = (
    "Containerfile", ".containerignore", "pyproject.toml", "README.md", "VERSION", "image/slim.py",
    "image/arm64.py", "image/sbom.py", "image/locks.py", "image/locks/agent.txt",
    "image/locks/aggregator.txt", "image/locks/build.txt",
)  # fmt: skip
# The level each image's interpreter runs at (Containerfile: PYTHONOPTIMIZE).
OPTIMIZE = {"agent": 2, "aggregator": 0}
SOURCE_DIRS = ("core", "agent", "aggregator")

MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
SUITE = "bookworm"
# Without -updates and -security OpenSSL and Python lag behind the fixes Debian ships.
SOURCES = (
    f"deb {MIRROR} {SUITE} main",
    f"deb {MIRROR} {SUITE}-updates main",
    f"deb {SECURITY} {SUITE}-security main",
)
# Documentation, man pages and translations are dead weight in an image; the copyright
# files stay, as Debian's licences ask.
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
BASES = {
    # binutils: strip, for the extension modules (Containerfile).
    "build": ("python3", "python3-venv", "ca-certificates", "binutils"),
}
# When the builder reaches PyPI through an intercepting proxy, its CA is in this bundle.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class ImageError(RuntimeError):
    pass


def project_version() -> str:
    return version.current()


def image_name(target: str) -> str:
    return f"dwd-lease-{target}"


def archive(target: str, directory: Path = BUILD_DIR) -> Path:
    return directory / f"{image_name(target)}.oci.tar"


def sbom_path(target: str, arch: str = "amd64", directory: Path = BUILD_DIR) -> Path:
    """The SPDX document of an image (image/sbom.py); the arm64 twin's beside it."""
    suffix = "" if arch == "amd64" else f"-{arch}"
    return directory / f"{image_name(target)}{suffix}.spdx.json"


def index_archive(target: str, directory: Path = BUILD_DIR) -> Path:
    """Both architectures' images under one OCI index."""
    return directory / f"{image_name(target)}.index.oci.tar"


def reference(target: str) -> str:
    """The name the image is loaded under into local container storage."""
    return f"localhost/{image_name(target)}:{project_version()}"


def containers_conf(directory: Path = BUILD_DIR) -> Path:
    """A containers.conf for podman on a machine like this one: runc (crun refuses cgroups in
    hybrid mode) and rlimits within what an unprivileged-resource root may set (podman's
    defaults ask for more than the hard limit, and without CAP_SYS_RESOURCE that fails)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "containers.conf"
    text = (
        "# Written by image/build.py: see its containers_conf().\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def tool_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(containers_conf())}


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def run(argv: Sequence[str], *, quiet: bool = True) -> str:
    proc = subprocess.run(list(argv), env=tool_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ImageError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed ({proc.returncode}):\n{tail}")
    if not quiet:
        sys.stderr.write(proc.stderr)
    return proc.stdout


def _hash(parts: Sequence[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()[:12]


def base_key(kind: str) -> str:
    args = (SUITE, *SOURCES, *DPKG_EXCLUDES, *BASES[kind])
    return _hash([a.encode() for a in args])


def inputs_key(base: str) -> str:
    parts = [base.encode()]
    for name in INPUT_FILES:
        parts += [name.encode(), (ROOT / name).read_bytes()]
    for d in SOURCE_DIRS:
        for f in sorted((ROOT / d).rglob("*.py")):
            parts += [str(f.relative_to(ROOT)).encode(), f.read_bytes()]
    return _hash(parts)


def image_exists(ref: str) -> bool:
    proc = subprocess.run(["podman", "image", "exists", ref], env=tool_env(), check=False)
    return proc.returncode == 0


def debian_base(kind: str) -> str:
    """A base image made from Debian's packages, imported into local storage once per key."""
    ref = f"localhost/dwd-lease-base-{kind}:{base_key(kind)}"
    if image_exists(ref):
        return ref
    tarball = CACHE_DIR / "bases" / f"{kind}-{base_key(kind)}.tar"
    if not tarball.exists():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        partial = tarball.with_suffix(".partial.tar")
        run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--quiet",
                # merged /usr the way Debian's own images are, without pulling a full Perl in.
                "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                *(f"--dpkgopt={o}" for o in DPKG_EXCLUDES),
                "--include=" + ",".join(BASES[kind]),
                SUITE,
                str(partial),
                *SOURCES,
            ]
        )
        partial.rename(tarball)
        log(f"base {kind}: mmdebstrap in {time.monotonic() - started:.0f}s")
    run(["podman", "import", "--quiet", str(tarball), ref])
    return ref


def build(base: str | None = None, *, force: bool = False) -> dict[str, Path]:
    """Both images as OCI archives under build/images/, from the cache when their inputs match.
    One build at a time (a lock in the cache): a test that asks while `make test` builds them
    beside it waits, then finds them cached."""
    if missing := missing_tools():
        raise ImageError(f"missing tools: {', '.join(missing)} (scripts/deps.sh installs them)")
    with lockfile.held(CACHE_DIR / ".building"):
        return _build(base, force=force)


def wait_for_build() -> None:
    """Returns when no build of the images is under way (at once when none is)."""
    lockfile.wait_until_free(CACHE_DIR / ".building", "the images")


def _build(base: str | None, *, force: bool) -> dict[str, Path]:
    bases = {"build": base} if base else {k: debian_base(k) for k in BASES}
    key = inputs_key(bases["build"])
    cached = CACHE_DIR / key
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # The index is the last file a target's build writes (its SBOMs come before it).
    if force or not all(index_archive(t, cached).exists() for t in TARGETS):
        started = time.monotonic()
        cached.mkdir(parents=True, exist_ok=True)
        for target in TARGETS:
            _build_one(target, bases, cached)
            _build_arm64(target, cached)
        log(f"images built in {time.monotonic() - started:.0f}s (key {key})")
    else:
        log(f"images cached (key {key})")
    out = {}
    for target in TARGETS:
        for path in (archive(target, cached), index_archive(target, cached)):
            shutil.copyfile(path, BUILD_DIR / path.name)
        for arch in ("amd64", arm64.ARCH):
            shutil.copyfile(sbom_path(target, arch, cached), sbom_path(target, arch))
        out[target] = archive(target)
    indexes = {image_name(t): index_archive(t) for t in TARGETS}
    ocm.write(BUILD_DIR, project_version(), _label(archive(TARGETS[0]), "revision"), source_url(), indexes)
    return out


def _label(oci_archive: Path, name: str) -> str:
    """An OCI label of an image archive (``org.opencontainers.image.<name>``): what it was
    built from, which a cached image keeps from the commit that built it."""
    config = json.loads(run(["skopeo", "inspect", "--config", f"oci-archive:{oci_archive}"]))
    return str(config["config"].get("Labels", {}).get(f"org.opencontainers.image.{name}", "unknown"))


def _build_one(target: str, bases: dict[str, str], directory: Path) -> None:
    ref = reference(target)
    argv = [
        "buildah",
        "bud",
        "--quiet",
        "--isolation",
        "chroot",
        "--layers=false",
        "--target",
        target,
        "--build-arg",
        f"BUILD_BASE={bases['build']}",
        "--build-arg",
        f"VERSION={project_version()}",
        "--build-arg",
        f"SOURCE={source_url()}",
        "--build-arg",
        f"REVISION={source_revision()}",
        # The commit's time as the images' and their files' time: the same inputs give the
        # same digest.
        "--timestamp",
        str(source_epoch()),
        "--tag",
        ref,
        "--file",
        str(ROOT / "Containerfile"),
    ]
    if HOST_CA_BUNDLE.exists():
        argv += ["--secret", f"id=pip-cert,src={HOST_CA_BUNDLE}"]
    run([*argv, str(ROOT)])
    partial = directory / f"{image_name(target)}.partial.tar"
    partial.unlink(missing_ok=True)
    run(["buildah", "push", "--quiet", ref, f"oci-archive:{partial}:{ref}"])
    partial.rename(archive(target, directory))


def _build_arm64(target: str, directory: Path) -> None:
    """The arm64 twin of the amd64 image just built, and the index of both."""
    started = time.monotonic()
    work = BUILD_DIR / "arm64" / target
    shutil.rmtree(work, ignore_errors=True)
    amd64 = rootfs(archive(target, directory), work / "amd64")
    tree = arm64.debian_tree(CACHE_DIR / "bases", SOURCES, SUITE)
    try:
        lock = locks.pins(locks.lock(target))
        arm64.assemble(amd64, work / "rootfs", tree, CACHE_DIR, OPTIMIZE[target], lock=lock)
    except arm64.Arm64Error as e:
        raise ImageError(f"{target} for arm64: {e}") from e
    config = json.loads(run(["skopeo", "inspect", "--config", f"oci-archive:{archive(target, directory)}"]))
    for arch, tree_of in (("amd64", amd64), (arm64.ARCH, work / "rootfs")):
        created = config["created"][:19] + "Z"  # SPDX: seconds, UTC
        doc = sbom.document(tree_of, image_name(target), project_version(), arch, created)
        sbom_path(target, arch, directory).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    ref, twin = reference(target), f"{reference(target)}-{arm64.ARCH}"
    ctr = run(["buildah", "from", "--quiet", "scratch"]).strip()
    try:
        run(["buildah", "copy", "--quiet", ctr, str(work / "rootfs"), "/"])
        conf = config["config"]
        argv = ["buildah", "config", "--arch", arm64.ARCH, "--os", "linux", "--user", conf["User"]]
        argv += ["--entrypoint", json.dumps(conf["Entrypoint"])]
        for env in conf.get("Env", []):
            argv += ["--env", env]
        for key, value in sorted(conf.get("Labels", {}).items()):
            argv += ["--label", f"{key}={value}"]
        run([*argv, ctr])
        run(["buildah", "commit", "--quiet", "--rm", "--timestamp", str(source_epoch()), ctr, twin])
    except ImageError:
        run(["buildah", "rm", ctr])
        raise
    index = f"{ref}-index"
    subprocess.run(["buildah", "manifest", "rm", index], env=tool_env(), capture_output=True, check=False)
    run(["buildah", "manifest", "create", index])
    for image in (ref, twin):
        run(["buildah", "manifest", "add", index, f"containers-storage:{image}"])
    partial = directory / f"{image_name(target)}.index.partial.tar"
    partial.unlink(missing_ok=True)
    run(["buildah", "manifest", "push", "--quiet", "--all", index, f"oci-archive:{partial}:{ref}"])
    partial.rename(index_archive(target, directory))
    shutil.rmtree(work, ignore_errors=True)
    log(f"{target} for {arm64.ARCH} and the index in {time.monotonic() - started:.0f}s")


def rootfs(oci_archive: Path, dest: Path, arch: str = "") -> Path:
    """The root filesystem of an OCI archive (of an index: its image for ``arch``), unpacked
    at ``dest``."""
    layout = dest.with_name(dest.name + ".layout")
    shutil.rmtree(layout, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    which = ["--override-arch", arch] if arch else []
    run(["skopeo", *which, "copy", "--quiet", f"oci-archive:{oci_archive}", f"dir:{layout}"])
    manifest = json.loads((layout / "manifest.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    for layer in manifest["layers"]:
        blob = layout / layer["digest"].split(":", 1)[1]
        with tarfile.open(blob) as tar:
            tar.extractall(dest, filter="fully_trusted")  # the image this build just made
    shutil.rmtree(layout)
    return dest


def source_url() -> str:
    """Where the sources come from: DWDDEV_IMAGE_SOURCE, else the clone's remote when it is a URL.
    Not part of the cache key: a label, not an input."""
    if url := os.environ.get("DWDDEV_IMAGE_SOURCE"):
        return url
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "config", "remote.origin.url"], capture_output=True, text=True, check=False
    )
    url = proc.stdout.strip()
    return url if "://" in url or "@" in url else "unknown"


def source_epoch() -> int:
    """The commit's time (SOURCE_DATE_EPOCH wins; 0 outside git): what the images say they
    were made at, so that a build made again gives the same digest."""
    if epoch := os.environ.get("SOURCE_DATE_EPOCH"):
        return int(epoch)
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=False
    )
    return int(proc.stdout.strip() or 0)


def source_revision() -> str:
    """The commit the sources are at (``-dirty`` when the work tree differs from it; the
    variable DWDDEV_IMAGE_REVISION wins), for the revision label. Not part of the cache key
    either: an image cached from an earlier commit with the same inputs names that commit,
    whose sources it was built from."""
    if revision := os.environ.get("DWDDEV_IMAGE_REVISION"):
        return revision
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", *INPUT_FILES, *SOURCE_DIRS],
        capture_output=True,
        text=True,
        check=False,
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def load(target: str) -> str:
    """Load the built archive into local container storage (for podman run); its reference."""
    ref = reference(target)
    run(["podman", "load", "--quiet", "--input", str(archive(target))])
    return ref


def log(message: str) -> None:
    print(f"image: {message}", file=sys.stderr, flush=True)

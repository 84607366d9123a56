"""An image's arm64 twin, assembled on an amd64 builder without running an arm64 binary.

The amd64 image is cut by image/slim.py, which runs the interpreter to find what the code
can import; a foreign interpreter cannot run here. So the twin is the same cut, file by
file: every file of the amd64 root filesystem that is not machine code is the same on
arm64 (Python sources, compiled modules, the CA bundle), and every ELF file is replaced by
its arm64 counterpart:

- the interpreter and the standard library's extension modules come from Debian's arm64
  packages of the same release (mmdebstrap's ``extract`` variant only unpacks them: no
  maintainer script, no emulator), under the same names with ``x86_64-linux-gnu`` read as
  ``aarch64-linux-gnu``; the shared libraries are what the arm64 files need (their
  DT_NEEDED entries, read by ``readelf``, to closure), not what the amd64 ones did;
- a compiled package of the virtualenv is replaced by the aarch64 manylinux wheel of the
  same version (``pip download --platform``), extension modules and bundled libraries,
  stripped by binutils' aarch64 ``strip`` where installed.

A file with no arm64 counterpart is an error that names it. tests/e2e/test_images.py checks
every ELF file of each arm64 image and imports every module of its build inside it, under
qemu's user-mode emulation (a test may run what a build must not).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from image import locks, slim

ARCH = "arm64"
TRIPLET = "aarch64-linux-gnu"
HOST_TRIPLET = "x86_64-linux-gnu"
# The ELF loader each architecture's binaries name (PT_INTERP), in /usr/lib under merged /usr.
LOADER = "ld-linux-aarch64.so.1"
HOST_LOADER = "ld-linux-x86-64.so.2"
EM_AARCH64, EM_X86_64 = 183, 62
# What the build stage's interpreter comes from (their dependencies follow), and the C++
# runtime that wheels built from C++ need (frozenlist's, in the aggregator).
PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "ca-certificates", "libstdc++6")
WHEEL_PLATFORMS = ("manylinux_2_17_aarch64", "manylinux2014_aarch64", "manylinux_2_28_aarch64")
STRIP = "aarch64-linux-gnu-strip"


class Arm64Error(RuntimeError):
    pass


def elf_machine(path: Path) -> int | None:
    """The ELF header's e_machine, None for a file that is not ELF."""
    try:
        with open(path, "rb") as f:
            return elf_machine_bytes(f.read(20))
    except OSError:
        return None


def elf_machine_bytes(head: bytes) -> int | None:
    """e_machine from the first 20 bytes of a file, None when they are not an ELF header."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def needed(path: Path) -> list[str]:
    """The shared libraries an ELF file names (DT_NEEDED), read without loading it."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=False).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
        raise Arm64Error(f"{argv[0]} failed ({proc.returncode}):\n{tail}")


def debian_tree(cache: Path, sources: tuple[str, ...], suite: str) -> Path:
    """Debian's arm64 packages of PACKAGES and their dependencies, unpacked (cached)."""
    key = hashlib.sha256(json.dumps([suite, sources, PACKAGES, "apt cache kept"]).encode()).hexdigest()[:12]
    tree = cache / f"arm64-tree-{key}"
    if (tree / ".complete").exists():
        return tree
    tarball = cache / f"arm64-tree-{key}.tar"
    cache.mkdir(parents=True, exist_ok=True)
    # The packages kept (the apt cache not cleaned up): their control data and file lists are
    # the twin's dpkg status (_dpkg_status).
    argv = ["mmdebstrap", "--variant=extract", f"--arch={ARCH}", "--quiet", "--skip=cleanup/apt/cache"]
    argv += ["--include=" + ",".join(PACKAGES)]
    _run([*argv, suite, str(tarball), *sources])
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir()
    with tarfile.open(tarball) as tar:
        tar.extractall(tree, filter="fully_trusted")  # our own mmdebstrap's output
    tarball.unlink()
    (tree / ".complete").touch()
    return tree


def _arm64_name(rel: str) -> str:
    return rel.replace(HOST_TRIPLET, TRIPLET).replace(HOST_LOADER, LOADER)


def _in_tree(tree: Path, rel: str) -> Path | None:
    """``rel`` (a merged-/usr path) in the unpacked packages, which keep /lib and /usr/lib apart;
    links followed inside the tree, never out to the builder's own files."""
    candidates = [rel]
    if rel.startswith(("usr/lib/", "usr/bin/")):
        candidates.append(rel.removeprefix("usr/"))
    for c in candidates:
        p = tree / c
        for _ in range(40):
            if not p.is_symlink():
                break
            target = os.readlink(p)
            p = Path(
                os.path.normpath(tree / target.lstrip("/") if target.startswith("/") else p.parent / target)
            )
        if p.exists() and not p.is_symlink() and p.is_relative_to(tree):
            return p
    return None


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        for name in dirnames:
            if (d / name).is_symlink():
                yield d / name
        for name in filenames:
            yield d / name


def _dists(site: Path) -> dict[str, tuple[str, str]]:
    """Each installed file of the virtualenv (relative to site-packages) -> (distribution, version)."""
    owner: dict[str, tuple[str, str]] = {}
    for info in site.glob("*.dist-info"):
        meta = (info / "METADATA").read_text(errors="replace")
        name = re.search(r"^Name: (.+)$", meta, re.M)
        version = re.search(r"^Version: (.+)$", meta, re.M)
        record = info / "RECORD"
        if not (name and version and record.exists()):
            continue
        for line in record.read_text().splitlines():
            owner[line.split(",", 1)[0]] = (name.group(1).strip(), version.group(1).strip())
    return owner


def _wheel(cache: Path, dist: str, version: str) -> Path:
    wheels = cache / "arm64-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[-_.]+", "_", dist).lower()
    for found in wheels.glob("*.whl"):
        if found.name.lower().startswith(f"{stem}-{version}-") and "aarch64" in found.name:
            return found
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    argv += [f"--platform={p}" for p in WHEEL_PLATFORMS]
    argv += ["--python-version=3.11", "--implementation=cp", "--abi=cp311", "--dest", str(wheels)]
    _run([*argv, f"{dist}=={version}"])
    return _wheel(cache, dist, version)


def assemble(
    amd64: Path,
    out: Path,
    tree: Path,
    cache: Path,
    optimize: int,
    *,
    lock: dict[str, tuple[str, frozenset[str]]],
) -> list[str]:
    """The arm64 root filesystem of the amd64 one at ``amd64``, written to ``out``; returns the
    arm64 files taken from wheels, each wheel one whose hash ``lock`` (the image's, image/locks.py)
    names."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    venv = Path("opt/dwd-lease")
    site = next((amd64 / venv / "lib").glob("python3*/site-packages"))
    owners = _dists(site)
    compiled: dict[tuple[str, str], list[str]] = {}
    for path in sorted(_walk(amd64)):
        rel = str(path.relative_to(amd64))
        if rel == "lib64" or rel.startswith(("lib64/", "usr/lib64/")):
            continue  # the amd64 loader's own path
        shared_library = rel.startswith(f"usr/lib/{HOST_TRIPLET}/")
        if shared_library and (path.is_symlink() or elf_machine(path) is not None):
            continue  # the arm64 files' own needs decide (_complete)
        if not path.is_symlink() and elf_machine(path) is not None and rel.startswith(str(venv)):
            key = owners.get(str(path.relative_to(site)))
            if key is None:
                raise Arm64Error(f"{rel}: machine code of no installed distribution")
            compiled.setdefault(key, []).append(str(path.relative_to(site)))
            continue
        _twin(path, rel, out, tree, optimize)
    _loader(out, tree)
    taken = _wheels(compiled, out / venv / site.relative_to(amd64 / venv), cache, lock)
    _complete(out, tree)
    _dpkg_status(out, tree)
    return taken


# Top-level directories a package lists that merged /usr keeps under usr/.
MERGED = ("bin/", "sbin/", "lib/", "lib64/")


def _dpkg_status(out: Path, tree: Path) -> list[str]:
    """The twin's dpkg status (the amd64 one was copied as it is): the arm64 packages whose
    files it holds, each with its own control data (its version may differ: a binNMU)."""
    owners: dict[str, Path] = {}
    for deb in sorted((tree / "var/cache/apt/archives").glob("*.deb")):
        listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(listing.stdout)) as tar:
            for member in tar.getmembers():
                rel = member.name.removeprefix("./")
                owners.setdefault("usr/" + rel if rel.startswith(MERGED) else rel, deb)
    held = {
        owners[rel]
        for path in _walk(out)
        if not path.is_symlink() and (rel := str(path.relative_to(out))) in owners
    }
    stanzas: dict[str, str] = {}
    for deb in sorted(held):
        control = subprocess.run(
            ["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True
        )
        fields = control.stdout.strip().splitlines()
        stanza = "\n".join([fields[0], "Status: install ok installed", *fields[1:]]) + "\n"
        stanzas[slim.dpkg_fields(stanza)["Package"]] = stanza
    # A package of every architecture (Architecture: all) the amd64 image holds files of: its
    # files were copied as they are, and it is the same package here.
    status = out / slim.DPKG_STATUS
    for name, stanza in slim.dpkg_stanzas(status.read_text() if status.exists() else "").items():
        if slim.dpkg_fields(stanza).get("Architecture") == "all":
            stanzas.setdefault(name, stanza)
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n".join(stanzas[name] for name in sorted(stanzas)))
    return sorted(stanzas)


def _twin(path: Path, rel: str, out: Path, tree: Path, optimize: int) -> None:
    """One file (or link) of the amd64 root filesystem, as arm64 has it."""
    dest = out / _arm64_name(rel)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        dest.symlink_to(_arm64_name(os.readlink(path)))
    elif elf_machine(path) is None and HOST_TRIPLET not in rel:
        shutil.copy2(path, dest)  # the same on every architecture
    elif rel.endswith(".pyc"):
        pass  # sysconfig's data module: compiled from the arm64 source below
    else:
        source = _in_tree(tree, _arm64_name(rel))
        if source is None:
            raise Arm64Error(f"{rel}: no arm64 counterpart {_arm64_name(rel)} in Debian's packages")
        shutil.copy2(source, dest)
        if dest.suffix == ".py":
            cfile = importlib.util.cache_from_source(str(dest), optimization=optimize or "")
            mode = py_compile.PycInvalidationMode.UNCHECKED_HASH  # as image/slim.py's
            py_compile.compile(
                str(dest),
                cfile,
                "/" + _arm64_name(rel),
                doraise=True,
                optimize=optimize,
                invalidation_mode=mode,
            )


def _loader(out: Path, tree: Path) -> None:
    """The loader, where every aarch64 binary looks for it (PT_INTERP: /lib/ld-linux-aarch64.so.1)."""
    found = _in_tree(tree, f"usr/lib/{TRIPLET}/{LOADER}")
    if found is None:
        raise Arm64Error(f"no {LOADER} in Debian's packages")
    (out / "usr/lib" / TRIPLET).mkdir(parents=True, exist_ok=True)
    shutil.copy2(found, out / "usr/lib" / TRIPLET / LOADER)
    (out / "usr/lib" / LOADER).symlink_to(f"{TRIPLET}/{LOADER}")


def _wheels(
    compiled: dict[tuple[str, str], list[str]],
    site: Path,
    cache: Path,
    lock: dict[str, tuple[str, frozenset[str]]],
) -> list[str]:
    taken = []
    for (dist, version), files in sorted(compiled.items()):
        path = _wheel(cache, dist, version)
        pinned, hashes = lock.get(locks.normalize(dist), ("", frozenset()))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if pinned != version or digest not in hashes:
            raise Arm64Error(f"{path.name}: sha256 {digest} is not in the lock for {dist}=={version}")
        wheel = zipfile.ZipFile(path)
        names = set(wheel.namelist())
        for rel in files:
            want = _arm64_name(rel)
            libs = rel.split("/", 1)[0].endswith(".libs")
            if libs:
                continue  # auditwheel's bundled libraries carry a hash: the wheel's own are taken below
            if want not in names:
                raise Arm64Error(f"{dist} {version}: its aarch64 wheel has no {want}")
        for name in sorted(names):
            if elf_machine_bytes(wheel.read(name)[:20]) is None:
                continue
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(wheel.read(name))
            if shutil.which(STRIP):
                _run([STRIP, "--strip-unneeded", str(dest)])
            taken.append(name)
    return taken


def _complete(out: Path, tree: Path) -> None:
    """Every library an ELF file of ``out`` needs, from the packages, until none is missing."""
    libdir = out / "usr/lib" / TRIPLET
    libdir.mkdir(parents=True, exist_ok=True)
    needs: dict[Path, list[str]] = {}  # each file read once, however many rounds it takes
    while True:
        have = {p.name for p in libdir.iterdir()} | {p.name for p in out.rglob("*.so*")}
        missing: dict[str, Path] = {}
        for path in _walk(out):
            if path not in needs and not path.is_symlink() and elf_machine(path) is not None:
                needs[path] = needed(path)
            missing |= {n: path for n in needs.get(path, ()) if n not in have}
        if not missing:
            return
        for name, user in sorted(missing.items()):
            source = _in_tree(tree, f"usr/lib/{TRIPLET}/{name}")
            if source is None:
                raise Arm64Error(f"{user.relative_to(out)} needs {name}: add its package to PACKAGES")
            shutil.copy2(source, libdir / name)

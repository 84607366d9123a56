"""An image's root filesystem, cut to what its code runs: run inside the image build
(Containerfile, stages ``agent-rootfs`` and ``aggregator-rootfs``) by the virtualenv's
interpreter, standard library only: ``slim.py ENTRY_MODULE ROOTFS [OPTIMIZE]``.

Into ROOTFS it copies the interpreter and the shared libraries it and its extension modules
load (as ``ldd`` lists them), the standard-library modules ENTRY_MODULE can import (the
static closure ``modulefinder`` finds: imports inside functions count, so a module loaded
only on an error path is there too; every codec, as a codec is looked up by name), the
virtualenv without the packages the entry never reaches, and the CA bundle. Nothing else:
no shell, no pip, no package manager, no tests or docs of the interpreter. It writes the
modules it found importable to ``/opt/dwd-lease/modules.txt``, which the image test imports
one by one inside the image.

OPTIMIZE (0, the default, or 2) is the level the image's interpreter runs at
(PYTHONOPTIMIZE): the standard library's compiled modules are copied, compiled here where
missing, at that level only. The agent runs at 2: without docstrings its modules take
1.1 MiB less of every node's memory (docs/measured.md); nothing it runs reads a docstring
or relies on an assert.
"""

from __future__ import annotations

import encodings
import importlib.util
import modulefinder
import os
import pkgutil
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

VENV = Path(sys.prefix)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Reached by the static closure only through paths neither image takes (help()'s topics, an
# interactive prompt, a debugger, test frameworks); excluded with what they pull in.
UNUSED = (
    "pydoc_data", "doctest", "unittest", "pdb", "readline", "rlcompleter", "curses",
    "tkinter", "idlelib", "lib2to3", "ensurepip", "venv", "pip", "setuptools",
    # Debian's hook for its crash reporter (apport), which no container has.
    "sitecustomize",
)  # fmt: skip
# Subpackages of reached packages that no code of ours takes: the kubernetes package's
# asyncio client (68 of the aggregator's 162 MB of virtualenv; the aggregator has its own).
SUBPACKAGES_UNUSED = ("kubernetes/aio",)
# Loaded by name at run time, never by an import statement modulefinder could see (sysconfig
# imports its data module by a name made of the platform's).
BY_NAME = ("_strptime.py", "_sysconfigdata_*.py")


def stdlib_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths["stdlib"]).resolve(), Path(paths["platstdlib"]).resolve()]


def agent_modules(entry: Path) -> dict[str, Path]:
    """name -> file of every module the agent can import (builtins have none)."""
    finder = modulefinder.ModuleFinder(excludes=list(UNUSED))
    finder.run_script(str(entry))
    files = {name: getattr(m, "__file__", None) for name, m in finder.modules.items()}
    found = {name: Path(file) for name, file in files.items() if file}
    found.pop("__main__", None)
    return found


def _copy(path: Path, rootfs: Path) -> None:
    """``path`` at the same place in ``rootfs``; a symbolic link as a link, then what it points
    to, one link at a time (the virtualenv's python -> python3 -> /usr/bin/python3 -> ...)."""
    dest = rootfs / path.relative_to("/")
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        target = os.readlink(path)
        dest.symlink_to(target)
        _copy(Path(os.path.normpath(path.parent / target)), rootfs)
    elif path.is_dir():
        shutil.copytree(path, dest, symlinks=True, dirs_exist_ok=True)
        for link in path.rglob("*"):
            if link.is_symlink() and not os.path.isabs(os.readlink(link)):
                continue  # inside the tree, copied with it
            if link.is_symlink():
                _copy(Path(os.readlink(link)), rootfs)
    else:
        shutil.copy2(path, dest)


def shared_libraries(binaries: list[Path]) -> set[Path]:
    """Every library the dynamic loader would map for ``binaries``, and the loader itself."""
    libs: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if "not found" in line:
                raise SystemExit(f"{binary}: {line.strip()}")
            match = re.search(r"(/\S+) \(0x", line)
            if match:
                libs.add(Path(match.group(1)))
    return libs


def importable(names: list[str]) -> list[str]:
    """Those of ``names`` that import here, with the whole standard library (some are optional
    parts of a dependency whose own dependencies are not installed: httpx's command line)."""
    probe = (
        "import importlib, sys\n"
        f"sys.modules.update(dict.fromkeys({UNUSED!r}))\n"  # as absent as in the image
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        continue\n"
        "    print(name)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, check=True)
    return out.stdout.split()


def prune(venv: Path, rootfs: Path, modules: dict[str, Path]) -> list[str]:
    """Remove from the copied virtualenv the packages the entry never reaches: a top-level
    package none of whose modules it imports, and the subpackages of SUBPACKAGES_UNUSED. Not
    every subpackage that looks unreached: a package may import its own by name (anyio its
    event-loop backends). Returns what it removed."""
    reached = [f.resolve() for f in modules.values()]
    site = next(venv.glob("lib/python3*/site-packages"))
    candidates = [init.parent for init in site.glob("*/__init__.py")]
    candidates += [site / sub for sub in SUBPACKAGES_UNUSED if (site / sub).is_dir()]
    removed = []
    for package in candidates:
        if any(f.is_relative_to(package) for f in reached):
            continue
        shutil.rmtree(rootfs / package.relative_to("/"))
        removed.append(str(package.relative_to(site)))
    return removed


def _copy_compiled(source: Path, rootfs: Path, optimize: int) -> None:
    """``source``'s compiled module at ``optimize``, compiled first where the build has none."""
    cache = Path(importlib.util.cache_from_source(str(source), optimization=optimize or ""))
    if not cache.exists():
        # By the source's hash (a build's time never enters the image: the same bytes twice).
        mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
        py_compile.compile(
            str(source), cfile=str(cache), optimize=optimize, doraise=True, invalidation_mode=mode
        )
    _copy(cache, rootfs)


def build(rootfs: Path, entry_module: str, optimize: int = 0) -> list[str]:
    # merged /usr: the loader's path in every ELF header is /lib64/..., /lib is usr/lib; the
    # links first, so that what is copied through them lands under usr/.
    for top in ("bin", "lib", "lib64", "sbin"):
        if Path("/", top).is_symlink():
            target = os.readlink(Path("/", top))
            (rootfs / top).symlink_to(target)
            (rootfs / top).resolve().mkdir(parents=True, exist_ok=True)
    entry = rootfs.parent / "entry.py"
    # Every codec with what it imports: a codec is looked up by name (a host name that is not
    # ASCII goes through "idna", which needs stringprep and unicodedata), never imported.
    codecs = [f"encodings.{m.name}" for m in pkgutil.iter_modules(encodings.__path__)]
    # site and runpy: what the interpreter itself loads at start and for ``-m``.
    names = [entry_module, "site", "runpy", *codecs]
    entry.write_text("".join(f"import {name}\n" for name in names))
    modules = agent_modules(entry)
    entry.unlink()
    stdlib = stdlib_dirs()
    kept: list[str] = []
    extensions: list[Path] = []
    for name, file in sorted(modules.items()):
        real = file.resolve()
        if not any(real.is_relative_to(d) for d in stdlib):
            continue  # the virtualenv's: copied whole below
        kept.append(name)
        _copy(real, rootfs)
        if real.suffix == ".py":
            _copy_compiled(real, rootfs, optimize)
        if real.suffix == ".so":
            extensions.append(real)
    for d in stdlib:
        for pattern in BY_NAME:
            for path in d.glob(pattern):
                _copy(path, rootfs)
                _copy_compiled(path, rootfs, optimize)
    _copy(VENV, rootfs)  # with its links to the interpreter
    prune(VENV, rootfs, modules)
    interpreter = Path(sys.executable)
    kept_so = [so for so in VENV.rglob("*.so") if (rootfs / so.relative_to("/")).exists()]
    for lib in shared_libraries([interpreter.resolve(), *extensions, *kept_so]):
        _copy(lib, rootfs)
    if CA_BUNDLE.exists():
        _copy(CA_BUNDLE, rootfs)
    (rootfs / "tmp").mkdir(exist_ok=True)
    listed = importable(sorted(m for m in modules if not m.endswith(".__main__") or m == entry_module))
    (rootfs / VENV.relative_to("/") / "modules.txt").write_text("\n".join(listed) + "\n")
    return kept


DPKG = Path("var/lib/dpkg")
DPKG_STATUS = DPKG / "status"


def dpkg_owners(root: Path) -> dict[str, str]:
    """Each file a Debian package installed in ``root``, by its real path (merged /usr: a
    package lists /lib/..., the file is /usr/lib/...), to the package's name."""
    owners: dict[str, str] = {}
    for listed in sorted((root / DPKG / "info").glob("*.list")):
        package = listed.stem.split(":")[0]
        for line in listed.read_text().splitlines():
            path = root / line.lstrip("/")
            # Files only: a link's target is its own package's (python3-minimal's
            # /usr/bin/python3 is a link to python3.11-minimal's /usr/bin/python3.11).
            if line and path.is_file() and not path.is_symlink():
                owners.setdefault(os.path.realpath(path), package)
    return owners


def dpkg_fields(stanza: str) -> dict[str, str]:
    """A dpkg stanza's fields (a multi-line field by its first line)."""
    return dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")


def dpkg_stanzas(status: str) -> dict[str, str]:
    """The installed packages' stanzas of a dpkg status file, by package name."""
    stanzas = {}
    for stanza in status.strip().split("\n\n"):
        fields = dpkg_fields(stanza)
        if fields.get("Status", "").endswith(" installed"):
            stanzas[fields["Package"]] = stanza.strip() + "\n"
    return stanzas


def keep_dpkg_status(rootfs: Path, root: Path = Path("/")) -> list[str]:
    """A dpkg status in ``rootfs`` (cut from ``root``) with the packages it holds a file of, so
    that a scanner sees the image's libc, OpenSSL and Python (the virtualenv's distributions
    it finds by their own metadata). Returns their names."""
    owners = dpkg_owners(root)
    held: set[str] = set()
    for path in rootfs.rglob("*"):
        if path.is_file() and not path.is_symlink():
            held.add(owners.get(os.path.realpath(root / path.relative_to(rootfs)), ""))
    stanzas = dpkg_stanzas((root / DPKG_STATUS).read_text())
    kept = sorted(held & stanzas.keys())  # "": a file no package installed
    status = rootfs / DPKG_STATUS
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n".join(stanzas[name] for name in kept))
    return kept


def main() -> None:
    entry_module, rootfs = sys.argv[1], Path(sys.argv[2])
    optimize = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if optimize not in (0, 2):
        sys.exit(f"slim.py: OPTIMIZE must be 0 or 2, not {optimize}")
    rootfs.mkdir(parents=True, exist_ok=True)
    kept = build(rootfs, entry_module, optimize)
    packages = keep_dpkg_status(rootfs)
    print(
        f"{entry_module} rootfs: {len(kept)} standard-library modules, files of {len(packages)} Debian "
        f"packages ({', '.join(packages)})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

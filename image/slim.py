"""The agent's root filesystem, cut to what it runs: run inside the image build (Containerfile,
stage ``agent-rootfs``) by the virtualenv's interpreter, standard library only.

Into ROOTFS it copies the interpreter and the shared libraries it and its extension modules
load (as ``ldd`` lists them), the standard-library modules the agent can import (the static
closure ``modulefinder`` finds from ``agent.__main__``: imports inside functions count, so a
module loaded only on an error path is there too; every codec, as a codec is looked up by
name), the virtualenv, and the CA bundle. Nothing else: no shell, no pip, no package
manager, no tests or docs of the interpreter. It writes the modules it kept to
``/opt/dwd-lease/modules.txt``, which the image test imports one by one inside the image.
"""

from __future__ import annotations

import encodings
import importlib.util
import modulefinder
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

VENV = Path(sys.prefix)
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Reached by the static closure only through paths the agent never takes (help(), a process
# pool, an interactive prompt, a debugger, test frameworks); excluded with what they pull in.
UNUSED = (
    "pydoc", "pydoc_data", "doctest", "unittest", "pdb", "readline", "rlcompleter", "curses",
    "tkinter", "idlelib", "lib2to3", "multiprocessing", "ensurepip", "venv", "pip", "setuptools",
    # Debian's hook for its crash reporter (apport), which no container has.
    "sitecustomize",
)  # fmt: skip
# Loaded by name at run time, never by an import statement modulefinder could see.
BY_NAME = ("_strptime",)


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


def build(rootfs: Path) -> list[str]:
    # merged /usr: the loader's path in every ELF header is /lib64/..., /lib is usr/lib; the
    # links first, so that what is copied through them lands under usr/.
    for top in ("bin", "lib", "lib64", "sbin"):
        if Path("/", top).is_symlink():
            target = os.readlink(Path("/", top))
            (rootfs / top).symlink_to(target)
            (rootfs / top).resolve().mkdir(parents=True, exist_ok=True)
    entry = rootfs.parent / "agent-entry.py"
    # Every codec with what it imports: a codec is looked up by name (uvloop's getaddrinfo
    # asks for "idna", which needs stringprep and unicodedata), never by an import statement.
    codecs = [f"encodings.{m.name}" for m in pkgutil.iter_modules(encodings.__path__)]
    # site and runpy: what the interpreter itself loads at start and for ``-m``.
    names = ["agent.__main__", "site", "runpy", *codecs]
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
        if real.suffix == ".py" and Path(cache := importlib.util.cache_from_source(str(real))).exists():
            _copy(Path(cache), rootfs)
        if real.suffix == ".so":
            extensions.append(real)
    for d in stdlib:
        for name in BY_NAME:
            for path in (d / name, d / f"{name}.py"):
                if path.exists():
                    _copy(path, rootfs)
    _copy(VENV, rootfs)  # with its links to the interpreter
    interpreter = Path(sys.executable)
    for lib in shared_libraries([interpreter.resolve(), *extensions, *VENV.rglob("*.so")]):
        _copy(lib, rootfs)
    if CA_BUNDLE.exists():
        _copy(CA_BUNDLE, rootfs)
    (rootfs / "tmp").mkdir(exist_ok=True)
    listed = importable(sorted(m for m in modules if not m.endswith(".__main__") or m == "agent.__main__"))
    (rootfs / VENV.relative_to("/") / "modules.txt").write_text("\n".join(listed) + "\n")
    return kept


def main() -> None:
    rootfs = Path(sys.argv[1])
    rootfs.mkdir(parents=True, exist_ok=True)
    kept = build(rootfs)
    print(f"agent rootfs: {len(kept)} standard-library modules", file=sys.stderr)


if __name__ == "__main__":
    main()

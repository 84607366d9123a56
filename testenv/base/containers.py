"""The project's images, run by podman as the manifests run them: for the end-to-end tests.

A container gets a read-only root filesystem, the manifests' user (65532), no
capabilities, and its files mounted read-only, each at the path its
environment names. The agent joins a node's network namespace
(``--network ns:/run/netns/NAME``) and resolves through that node's DNS
server; the aggregator shares the host's network, where the control planes
listen on loopback.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from image import build
from testenv.base.process import Process, spawn

USER = "65532:65532"


def images() -> dict[str, str]:
    """Both images built (from the cache when warm) and loaded; their references."""
    build.build()
    return {target: build.load(target) for target in build.TARGETS}


def run(
    ref: str,
    *,
    name: str,
    log_path: Path,
    env: Mapping[str, str],
    mounts: Mapping[Path, str],
    network: str,
    dns: Sequence[str] = (),
    user: str = USER,
) -> Process:
    """``podman run`` in the foreground: SIGTERM to the returned process reaches the program."""
    argv = [
        "podman",
        "run",
        "--rm",
        "--name",
        name,
        "--replace",
        f"--network={network}",
        "--read-only",
        f"--user={user}",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--pull=never",
        "--log-driver=none",
    ]
    for server in dns:
        argv += [f"--dns={server}", "--dns-option=timeout:1", "--dns-option=attempts:1"]
    for host, inside in mounts.items():
        argv += ["--volume", f"{host}:{inside}:ro"]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    return spawn(name, [*argv, ref], log_path=log_path, env=build.tool_env())


def remove(name: str) -> None:
    """Make sure a container is gone, whatever became of its podman process."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(
            ["podman", "rm", "--force", "--time", "2", name],
            env=build.tool_env(),
            capture_output=True,
            timeout=30,
            check=False,
        )


def mounted_files(env: Mapping[str, str], directory: Path, inside: str) -> dict[str, str]:
    """``env`` for a container that gets ``directory`` mounted at ``inside``: every value that
    names a file is copied there and renamed; a kubeconfig carries its files as data (its
    key files are root's, the container's user could not read them)."""
    directory.mkdir(mode=0o755, exist_ok=True)
    out = dict(env)
    for key, value in env.items():
        path = Path(value)
        if not value.startswith("/") or not path.is_file():
            continue
        target = directory / f"{key.lower()}{path.suffix}"
        if key.endswith("KUBECONFIG"):
            target.write_text(yaml.safe_dump(inline_kubeconfig(yaml.safe_load(path.read_text()))))
        else:
            target.write_bytes(path.read_bytes())
        target.chmod(0o644)
        out[key] = f"{inside}/{target.name}"
    return out


def inline_kubeconfig(config: dict[str, Any]) -> dict[str, Any]:
    for entry in [*config.get("clusters", []), *config.get("users", [])]:
        body = entry.get("cluster") or entry.get("user") or {}
        for field in ("certificate-authority", "client-certificate", "client-key"):
            if field in body:
                body[f"{field}-data"] = base64.b64encode(Path(body.pop(field)).read_bytes()).decode()
    return config

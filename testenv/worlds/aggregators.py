"""The one way the harness starts an aggregator, for the tests, the demo, the benchmarks and the
soak rig: its settings (``DWD_*``) as one mapping, everything else a typed option.

What it serves comes as options (``shoot_kubeconfig``, ``seed_kubeconfig``, ``namespace``) and
``env`` may still override any of them: a test of gardener mode clears ``DWD_SHOOT_KUBECONFIG``,
one of the shipped RBAC names its own seed kubeconfig.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from testenv.base import containers
from testenv.base.process import Process, spawn_python

# Where an aggregator from its image finds the files its variables name.
MOUNTED_AT = "/etc/dwd-lease"


@dataclass(frozen=True)
class FromSource:
    """``python -m module`` from this interpreter; ``source``: another release's tree, imported
    before the installed packages."""

    module: str = "aggregator"
    source: Path | None = None


@dataclass(frozen=True)
class FromImage:
    """The aggregator's image on the host's network, as container ``container`` (killing
    ``podman run`` leaves it running: ``containers.remove`` it), the files its variables name
    copied into ``files`` and mounted read-only, kubeconfigs carrying their credentials as a
    Secret's would."""

    image: str
    container: str
    files: Path


def aggregator_env(
    env: Mapping[str, str],
    *,
    shoot_kubeconfig: Path | None = None,
    seed_kubeconfig: Path | None = None,
    namespace: str | None = None,
) -> dict[str, str]:
    """The aggregator's variables: what it serves (the options given), then ``env``."""
    serves = {
        "DWD_SHOOT_KUBECONFIG": shoot_kubeconfig,
        "DWD_SEED_KUBECONFIG": seed_kubeconfig,
        "DWD_NAMESPACE": namespace,
    }
    return {**{key: str(value) for key, value in serves.items() if value is not None}, **env}


def start_aggregator(
    env: Mapping[str, str],
    *,
    name: str,
    log_path: Path,
    shoot_kubeconfig: Path | None = None,
    seed_kubeconfig: Path | None = None,
    namespace: str | None = None,
    run: FromSource | FromImage = FromSource(),
) -> Process:
    """An aggregator with ``aggregator_env``'s variables, its output in ``log_path``."""
    full = aggregator_env(
        env, shoot_kubeconfig=shoot_kubeconfig, seed_kubeconfig=seed_kubeconfig, namespace=namespace
    )
    if isinstance(run, FromImage):
        mounted = containers.mounted_files(full, run.files, MOUNTED_AT)
        mounted.pop("PATH", None)  # the image's own
        return containers.run(
            run.image,
            name=run.container,
            log_path=log_path,
            env=mounted,
            mounts={run.files: MOUNTED_AT},
            network="host",
        )
    return spawn_python(name, run.module, log_path=log_path, env=full, source=run.source)

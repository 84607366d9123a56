"""The interpreter settings the agent's image runs with, for benchmarks that run the agent
from this checkout: its PYTHONOPTIMIZE (image/build.py's, the Containerfile's), with every
module compiled at that level beforehand, into a cache of its own (PYTHONPYCACHEPREFIX) so
the Python installation is left as it is. Without them a benchmark would measure docstrings
the image does not load, or modules compiled at every start that the image has compiled once."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from image.build import OPTIMIZE

ROOT = Path(__file__).resolve().parents[2]
PREFIX = Path.home() / ".cache" / "dwd-lease" / f"pycache-opt2-py{sys.version_info[0]}{sys.version_info[1]}"


def env() -> dict[str, str]:
    """The environment variables; compiles what is not compiled yet (a few seconds, once)."""
    paths = sysconfig.get_paths()
    ours = [str(ROOT / "agent"), str(ROOT / "core")]
    dirs = dict.fromkeys([paths["stdlib"], paths["purelib"], paths["platlib"], *ours])
    settings = {"PYTHONOPTIMIZE": str(OPTIMIZE["agent"]), "PYTHONPYCACHEPREFIX": str(PREFIX)}
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", *dirs],
        env={**os.environ, **settings},
        stdout=subprocess.DEVNULL,
        check=False,  # a file of the installation that does not compile is not the agent's
    )
    return settings

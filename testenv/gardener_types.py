"""Gardener's objects checked against Gardener's own Go types: a Cluster (and the Shoot, Seed and
CloudProfile it embeds), a Shoot, Seed or CloudProfile, a ManagedResource.

The seed's CRDs in testenv are schemaless (testenv/gardener.py), and Go's JSON decoding drops a
field it does not know: a fixture with ``status.isHibernated`` where Gardener writes
``status.hibernated`` would be read by dependency-watchdog as "not hibernated", and a test built
on it would prove nothing. The checker (testenv/go/gardener-types/main.go, built beside
gardener-resource-manager from the same Gardener release) decodes strictly: an unknown,
misspelt or duplicate field is an error naming its path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from testenv import grm

CHECKER = grm.GARDENER_TYPES


def build(*, force: bool = False, log: TextIO = sys.stderr) -> Path:
    """Build the checker unless it is cached (with GRM, when that is missing too: one go build)."""
    only = (CHECKER,) if not grm.missing(grm.GRM) else (grm.GRM, CHECKER)
    return grm.build(force=force, log=log, only=only)[CHECKER.name]


def find() -> Path:
    return grm.find(CHECKER)


def strict_errors(objects: Sequence[dict[str, Any]], timeout_s: float = 60.0) -> list[str]:
    """One error string per object ("" for one Gardener's types decode strictly), from one run
    of the checker for the whole list."""
    done = subprocess.run(
        [str(find())],
        input=json.dumps(list(objects)),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{CHECKER.name} exited {done.returncode}: {done.stderr.strip()}")
    errors: list[str] = json.loads(done.stdout)
    if len(errors) != len(objects):
        raise RuntimeError(f"{CHECKER.name} answered {len(errors)} for {len(objects)} objects")
    return errors

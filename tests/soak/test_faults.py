"""The fault suite in CI: a short slice of one fixed plan (tests/soak/faults.py), every defect
the report counts at 0. ``make soak`` runs it long (``SOAK_CYCLES``, 50 by default).

``DWDDEV_FAULT_CYCLES`` and ``DWDDEV_FAULT_SEED`` run another slice. The default one holds each
kind of cycle (outage, minority, shoot KAPI restart) and each extra (leader SIGKILL, seed
500/429, handover, dependency-watchdog, an operator's scale, SIGKILL in the scale-up window)
and takes about 2 minutes on 2 cores, the rig's start included.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
from pathlib import Path
from typing import TextIO

import pytest

from tests.soak import faults, plan

pytestmark = pytest.mark.integration

DEFAULT_CYCLES, DEFAULT_SEED = 3, 38
CYCLES = int(os.environ.get("DWDDEV_FAULT_CYCLES") or DEFAULT_CYCLES)
SEED = int(os.environ.get("DWDDEV_FAULT_SEED") or DEFAULT_SEED)
# The rig's start, then per cycle its longest: an outage of 15 s, settling twice (an operator's
# count, then the configured one) and the last chance of a rig that has not settled.
TIMEOUT_S = 120 + CYCLES * (15 + 2 * faults.SETTLE_S + faults.LAST_CHANCE_S)


class _Tee(io.StringIO):
    """Kept, and passed on as it comes: the progress lines show while the slice runs (-s)."""

    def __init__(self, through: TextIO) -> None:
        super().__init__()
        self.through = through

    def write(self, s: str) -> int:
        self.through.write(s)
        return super().write(s)

    def flush(self) -> None:
        self.through.flush()


@pytest.mark.timeout(TIMEOUT_S)
def test_random_faults_cause_no_defect(tmp_path: Path) -> None:
    out = _Tee(sys.stdout)
    with contextlib.redirect_stdout(out):
        results = faults.run(CYCLES, SEED, tmp_path)
    found = faults.failures(results, CYCLES)
    assert not found, f"seed {SEED}, {CYCLES} cycles: {'; '.join(found)}\n{out.getvalue()}"


def test_the_default_slice_holds_every_kind_and_every_extra() -> None:
    rng = random.Random(DEFAULT_SEED)
    plans = [plan.draw(rng, n) for n in range(1, DEFAULT_CYCLES + 1)]
    assert {p.kind for p in plans} == set(plan.KINDS)
    assert {e.what for p in plans for e in p.extras} == set(plan.EXTRAS)

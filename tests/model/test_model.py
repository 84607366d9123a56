"""The stateful model in CI: a bounded, repeatable exploration (a fixed seed), after a replay of
every example it has found before (tests/model/examples/, committed: each a regression case).

``make soak`` explores for as long as it is given (``DWDDEV_SOAK_MINUTES``, fresh random seeds) and
prints how many sequences and steps it ran.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test

from tests.model.machine import COUNTS, DryRunModel, Model, RollModel

EXAMPLES = Path(__file__).parent / "examples"
# The CI budget: about a minute per machine on this 2-core machine.
BUDGET = {"Model": 70, "DryRunModel": 25, "RollModel": 12}
SEED = 20261202
SOAK_MINUTES = float(os.environ.get("DWDDEV_SOAK_MINUTES") or 0)
SOAK_SHARE = {"Model": 0.6, "DryRunModel": 0.2, "RollModel": 0.2}


@contextmanager
def silenced() -> Iterator[None]:
    """A run logs thousands of transitions. Not cached and reset afterwards: a logger cached at
    this level would stay silent for the tests that capture logs later in the same process."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL), cache_logger_on_first_use=False
    )
    try:
        yield
    finally:
        structlog.reset_defaults()


def explore(machine: type[RuleBasedStateMachine], examples: int, fixed_seed: int | None) -> None:
    test = get_state_machine_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=DirectoryBasedExampleDatabase(str(EXAMPLES / machine.__name__)),
            print_blob=True,
        ),
    )
    if fixed_seed is not None:
        test = seed(fixed_seed)(test)
    with silenced():
        test()


@pytest.mark.timeout(0 if SOAK_MINUTES else 600)
@pytest.mark.parametrize("machine", [RollModel, Model, DryRunModel], ids=lambda m: m.__name__)
def test_the_guarantees_hold_in_every_interleaving_the_model_explores(
    machine: type[RuleBasedStateMachine],
) -> None:
    name = machine.__name__
    if not SOAK_MINUTES:
        # DWDDEV_MODEL_EXAMPLES: a longer run on the same seed (python -m tests.model.mutants).
        explore(machine, int(os.environ.get("DWDDEV_MODEL_EXAMPLES") or BUDGET[name]), SEED)
        return
    started = time.monotonic()
    while time.monotonic() - started < SOAK_MINUTES * 60 * SOAK_SHARE[name]:
        explore(machine, 10, None)  # a fresh random seed each round
    print(
        f"\nsoak {name}: {COUNTS[name, 'sequences']} sequences, {COUNTS[name, 'steps']} steps "
        f"in {(time.monotonic() - started) / 60:.1f} min, no invariant broken"
    )

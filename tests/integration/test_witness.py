"""The second witness against real API servers: agents that fail on a working path, while the
kubelets keep renewing ``kube-node-lease`` (``NodeLeaseDriver``), never scale a shoot down;
a real cut still does, as fast as before."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from testenv.controllers import CONTROLLERS, DOWN
from testenv.wait import wait_for
from tests.integration.dwdworld import NODES, DwdWorld

pytestmark = pytest.mark.integration


def judging(w: DwdWorld) -> None:
    w.shoot.start_aggregator()
    w.shoot.wait_leases_renewed()
    time.sleep(3)  # past one lease duration of fresh view


@pytest.mark.timeout(120)
def test_every_agent_silent_on_a_working_path_scales_nothing_down(world_for: Callable[..., DwdWorld]) -> None:
    """Every agent stops (all SIGKILLed, or every renewal answered 403) while every kubelet keeps
    renewing: no controller may be lowered."""
    w = world_for()
    judging(w)
    sampler = w.shoot.sampler()
    w.shoot.driver.alive = set()  # the agents, not the path
    time.sleep(15)  # seven lease durations, the confirm period many times over
    dip = sampler.first(lambda s: s.replicas != CONTROLLERS)
    assert dip is None, f"scaled down while every kubelet renewed: {dip}"
    reasons = [e.get("reason") for e in w.shoot.events()]
    assert "AgentsSilentPathAlive" in reasons, reasons


@pytest.mark.timeout(120)
def test_a_real_cut_still_scales_down(world_for: Callable[..., DwdWorld]) -> None:
    w = world_for()
    judging(w)
    cut = time.monotonic()
    w.cut(set(NODES[:7]))
    wait_for(lambda: w.shoot.replicas() == DOWN, 20, "every controller scaled down", every_s=0.1)
    took = time.monotonic() - cut
    # Lease duration 2 s and confirm 1 s on the test clock, the interlocks and the levels.
    assert took < 8, took
    w.heal()
    wait_for(lambda: w.shoot.replicas() == CONTROLLERS, 30, "restored", every_s=0.2)

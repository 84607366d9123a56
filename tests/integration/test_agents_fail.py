"""Agents that fail on a working path, with the real pieces: agent processes and real kubelets
(kubemark's hollow node) behind one load balancer, the aggregator as a process. The agents' RoleBinding
removed (403), a webhook that fails for ``dwd-node-lease`` leases (500), every agent SIGKILLed.
The kubelets keep renewing ``kube-node-lease`` through the same path: from healthy nothing may be
scaled down; already scaled down by a real cut, the controllers come back once the path heals
for the kubelets, while the agents still fail.

Each test was seen failing with the aggregator from before the witness (525dc0b).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aggregator.model.settings import DeciderSettings
from testenv.base.wait import wait_for
from testenv.kube.controllers import CONTROLLERS
from tests.alerting import alert, check, samples, scraped
from tests.integration.dwdworld import NODES
from tests.integration.nodesworld import DOWN, LEASE_DURATION_S, RECOVERY_PERIOD_S, NodesWorld

pytestmark = pytest.mark.integration

# From the agents' failure: the stale quorum lasts 90 confirm periods of the test clock and nine
# renewals of every kubelet (each 10 s), and the aggregator tells its Event once the episode has
# lasted a kubelet read (10 s).
WINDOW_S = 90.0
# The path heals and the kubelets renew: the aggregator sees it on its next LIST of them (every
# 10 s while not healthy), then restores after the recovery period and MCM's 500 ms; each with
# slack for a busy machine.
SEEN_S = DeciderSettings().witness_every_s + 5.0
RESTORE_S = RECOVERY_PERIOD_S + 0.5 + 5.0


BREAK: dict[str, Callable[[NodesWorld], None]] = {
    "forbidden": NodesWorld.forbid_agents,
    "webhook": NodesWorld.break_admission,
    "killed": NodesWorld.kill_agents,
}


def seen_failing(w: NodesWorld, failure: str) -> None:
    """The agents fail as they should: a test of a failure that did not happen proves nothing."""
    if failure == "forbidden":
        wait_for(lambda: w.agents_failing("http-403"), 15, "every agent's renewal answered 403")
    elif failure == "webhook":
        wait_for(lambda: w.agents_failing("http-500"), 15, "every agent's renewal answered 500")
        assert w.webhook.calls > 0
    else:
        assert [p.popen.returncode for p in w.procs] == [-9] * len(w.procs)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("failure", BREAK)
def test_agents_failing_on_a_working_path_scale_nothing_down(
    real_nodes: NodesWorld, failure: str, tmp_path: Path
) -> None:
    w = real_nodes.start()
    sampler = w.shoot.sampler()
    broken = time.monotonic()
    BREAK[failure](w)
    seen_failing(w, failure)
    time.sleep(max(0.0, broken + WINDOW_S - time.monotonic()))  # nothing to wait for: nothing may happen
    # The agents really are silent: every lease is stale to the aggregator.
    assert min(w.lease_ages_s()) > LEASE_DURATION_S, w.lease_ages_s()
    dip = sampler.first(lambda s: s.replicas != CONTROLLERS, after=broken)
    assert dip is None, f"scaled down while every kubelet renewed: {dip}"
    wait_for(lambda: "AgentsSilentPathAlive" in w.event_reasons(), 20, "the AgentsSilentPathAlive Event")
    # The alert, on what the aggregator exports now: every agent silent, every kubelet renewing.
    exported = w.metrics()
    assert samples(exported)[f'dwd_target_agent_silent_path_alive{{target="{w.shoot.namespace}"}}'] == len(
        NODES
    )
    silent = {"severity": "warning", "target": w.shoot.namespace, "value": str(len(NODES))}
    check(
        tmp_path,
        scraped(exported, instance="aggregator"),
        alert("4m", "DwdLeaseAgentsSilentPathAlive"),
        alert("6m", "DwdLeaseAgentsSilentPathAlive", silent),
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("failure", BREAK)
def test_agents_failing_after_a_cut_are_restored_once_the_kubelets_prove_the_path(
    real_nodes: NodesWorld, failure: str
) -> None:
    w = real_nodes.start()
    cut = time.monotonic()
    w.cut()
    # The kubelets' next renewals due (up to 11.9 s after the cut) and read: then the cut is acted on.
    wait_for(lambda: w.shoot.replicas() == DOWN, 30, "every controller scaled down by the cut", every_s=0.1)
    # Whatever the kubelets' phase: their interval, the slack and a look, the interlocks, the levels.
    assert time.monotonic() - cut < 16, time.monotonic() - cut
    BREAK[failure](w)  # while cut: the agents meet it once the path heals
    healed = time.time()
    w.heal()
    # kubelet retries a refused path at most 7 s apart (docs/measured.md).
    wait_for(lambda: w.kubelets_renewed_after(healed), 20, "every kubelet renewing through the load balancer")
    proved = max(w.kubelet_renewals().values())  # the last of them to prove the path
    seen_failing(w, failure)
    recovering = wait_for(lambda: w.entered("recovering", healed), SEEN_S + 5, "the aggregator recovering")
    assert recovering.at - proved < SEEN_S, (recovering.at - proved, recovering)
    assert "silent while their kubelets renew" in recovering.reason, recovering
    wait_for(
        lambda: w.shoot.replicas() == CONTROLLERS, RESTORE_S + 5, "every controller restored", every_s=0.1
    )
    took = time.time() - recovering.at
    assert took < RESTORE_S, took
    # Restored by the kubelets' word alone: no agent renewed since the cut.
    assert min(w.lease_ages_s()) > time.time() - healed, w.lease_ages_s()

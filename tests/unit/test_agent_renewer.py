"""The renewal state machine against a scripted client and a manual clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.client import LeaseClient
from agent.renewer import MAX_BACKOFF_S, Renewer
from agent.settings import Settings
from core.errors import Invalid, NotFound, ServerError, TooManyRequests, TransportError
from core.lease import (
    LAST_OUTAGE,
    PREVIOUS_RENEW,
    RELEASED,
    RENEW_INTERVAL,
    Outage,
    release_patch,
    renewal_phase_s,
)
from tests.unit.virtualtime import in_virtual_time

Logs = list[MutableMapping[str, Any]]
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


class FakeClient(LeaseClient):
    """Answers each PATCH with the next scripted lease or exception. A JSON patch (a list) is
    the agent's evidence patch: the answer carries the renewTime it overwrote, as KAPI's does.
    A LeaseClient to the renewer with no network behind it (LeaseClient's ``__init__`` is not
    called)."""

    def __init__(self, clock: Clock) -> None:
        self.clock: Clock = clock
        self.script: list[Any] = []
        self.calls: list[tuple[str, Any, float]] = []
        self.closed = 0
        self.latency_s = 0.0
        self.stored_renew_time: str | None = None
        self.on_attempt = lambda attempt: None
        # The old layout's lease (``path``): its PATCHes and scripted answers, apart.
        self.legacy_calls: list[tuple[str, Any]] = []
        self.legacy_script: list[Any] = []

    async def patch(self, body: Any, *, window_s: float, path: str = "") -> dict[str, Any]:
        if path:
            self.legacy_calls.append((path, body))
            outcome = self.legacy_script.pop(0) if self.legacy_script else lease()
            if isinstance(outcome, Exception):
                raise outcome
            return dict(outcome)
        kind = "merge" if isinstance(body, dict) else "json"
        self.calls.append((kind, body, window_s))
        self.clock.now += self.latency_s
        outcome = self.script.pop(0) if self.script else lease()
        previous = self.stored_renew_time
        renew = body.get("spec", {}).get("renewTime") if kind == "merge" else body[1]["value"]
        if isinstance(outcome, Landed):  # unanswered, but applied
            self.stored_renew_time = renew
            raise outcome.error
        if isinstance(outcome, Exception):
            raise outcome
        self.stored_renew_time = renew or self.stored_renew_time
        answer = {**outcome, "spec": {**outcome["spec"], "renewTime": self.stored_renew_time}}
        if kind == "json":
            annotations = {**answer["metadata"]["annotations"], PREVIOUS_RENEW: previous}
            answer["metadata"] = {**answer["metadata"], "annotations": annotations}
        return answer

    def reload_tls(self) -> str:
        return ""

    async def aclose(self) -> None:
        self.closed += 1


@dataclass
class Landed:
    """A PATCH the server applied whose answer never came back."""

    error: TransportError


def unanswered() -> TransportError:
    return TransportError("timeout", "no answer within 4s", sent=True)


def lease(interval: str | None = None) -> dict[str, Any]:
    # Every real lease carries annotations (the aggregator's owner and interval).
    annotations = {"example.com/owner": "aggregator", **({RENEW_INTERVAL: interval} if interval else {})}
    return {"kind": "Lease", "metadata": {"name": "n1", "annotations": annotations}, "spec": {}}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(clock: Clock) -> FakeClient:
    return FakeClient(clock)


@pytest.fixture
def renewer(clock: Clock, client: FakeClient, tmp_path: Path) -> Renewer:
    token = tmp_path / "token"
    token.write_text("t")
    settings = Settings(
        apiserver_url="https://api.example", node_name="n1", token_file=str(token), legacy_namespace=""
    )
    return Renewer(settings, client, clock=clock, wall=clock.wall)


@pytest.fixture
def logs() -> Iterator[Logs]:
    with capture_logs() as captured:
        yield captured


async def renew_every_2s(renewer: Renewer, clock: Clock, times: int) -> None:
    for _ in range(times):
        clock.now += 2
        await renewer.renew_once()


def recorded_outage(client: FakeClient) -> Outage:
    """The last-outage record of the latest plain renewal."""
    return Outage.from_annotation(patches(client)[-1]["metadata"]["annotations"][LAST_OUTAGE])


def patches(client: FakeClient) -> list[dict[str, Any]]:
    """The plain (merge) renewals."""
    return [body for kind, body, _ in client.calls if kind == "merge"]


def events(logs: Logs) -> list[str]:
    return [e["event"] for e in logs if e["log_level"] != "debug"]


def at_phase(delay: float, interval: float, clock: Clock) -> bool:
    """After a renewal, the next one is the node's phase on the wall clock, half an interval to
    one and a half away (core/lease.py)."""
    due = clock.wall().timestamp() + delay
    off = (due - renewal_phase_s("n1", interval)) % interval
    return interval / 2 <= delay < 1.5 * interval and min(off, interval - off) < 1e-6


async def test_a_slow_interval_renews_at_the_nodes_phase(
    renewer: Renewer, client: FakeClient, clock: Clock
) -> None:
    """At 2 min every renewal is at the node's own phase, whenever the previous one happened: after
    an outage heals the slow nodes do not renew in one burst, every interval."""
    client.script = [lease("2m")] * 3
    for _ in range(3):
        delay = await renewer.renew_once()
        assert at_phase(delay, 120.0, clock)
        clock.now += delay + 7.3  # a renewal that started late does not move the phase


async def test_first_renewal_clears_released_later_ones_do_not(renewer: Renewer, client: FakeClient) -> None:
    assert await renewer.renew_once() == 2.0
    assert await renewer.renew_once() == 2.0
    first, second = patches(client)
    assert first["metadata"]["annotations"] == {RELEASED: None}
    assert "metadata" not in second
    assert second["spec"] == {"holderIdentity": "n1", "renewTime": "2026-11-30T12:01:40.000000Z"}
    assert renewer.metrics.renewals.get() == 2


async def test_a_renewal_may_take_two_intervals_at_most_ten_seconds(
    renewer: Renewer, client: FakeClient
) -> None:
    await renewer.renew_once()
    assert client.calls[-1][2] == 4.0
    client.script = [lease("60s")]
    await renewer.renew_once()
    await renewer.renew_once()
    assert client.calls[-1][2] == 10.0


async def test_outage_logged_once_per_state_change_and_reported_after_recovery(
    renewer: Renewer, client: FakeClient, clock: Clock, logs: Logs
) -> None:
    await renewer.renew_once()
    refused = TransportError(
        "connect", "refused", path=({"connection": "new", "dns": 0.001, "stuck": "connect"},)
    )
    client.script = [refused, refused]
    for _ in range(2):
        clock.now += 2
        await renewer.renew_once()
    assert renewer.metrics.failures.get(**{"class": "connect"}) == 2
    client.script = [ServerError(503, "ServiceUnavailable", "")]
    clock.now += 2
    await renewer.renew_once()
    clock.now += 2.5
    await renewer.renew_once()  # recovers
    assert events(logs) == [
        "lease_renewing",
        "renew_failing",
        "renew_failing",
        "renew_recovered",
        "lease_renewing",
    ]
    assert [e.get("failure") for e in logs if e["event"] == "renew_failing"] == ["connect", "http-503"]
    assert [e["proven"] for e in logs if e["event"] == "renew_recovered"] == [True]
    assert "READ" not in [m for m, _, _ in client.calls]  # nothing was sent unanswered: nothing to check
    outage = recorded_outage(client)
    assert outage.failure_class == "connect"  # what began the outage
    assert outage.start == T0 + timedelta(seconds=102)
    assert outage.duration_s == pytest.approx(6.5)
    assert outage.path is not None and outage.path["failed"] == [
        {"connection": "new", "dns": 0.001, "stuck": "connect"}
    ]
    # Reported once: the next renewal is plain again.
    clock.now += 2
    await renewer.renew_once()
    assert "metadata" not in patches(client)[-1]


async def test_unanswered_renewals_that_landed_are_no_outage(
    renewer: Renewer, client: FakeClient, clock: Clock, logs: Logs
) -> None:
    """Phantom renewals: each PATCH reached KAPI after the agent gave up on its answer. The lease
    never went stale, so the agent must not report an outage the lease never showed."""
    await renewer.renew_once()
    client.script = [Landed(unanswered()) for _ in range(5)]
    for _ in range(5):
        clock.now += 2
        await renewer.renew_once()
    assert renewer.state == "failing"
    assert renewer.metrics.unanswered.get() == 5
    clock.now += 2
    await renewer.renew_once()
    # After the first unanswered one, each renewal keeps the renewTime it overwrites.
    assert [kind for kind, _, _ in client.calls] == ["merge", "merge"] + ["json"] * 5
    recovered = [e for e in logs if e["event"] == "renew_recovered"]
    assert [(e["proven"], e["outage_s"]) for e in recovered] == [(False, 0.0)]
    assert renewer.metrics.landed_unseen.get() == 1
    clock.now += 2
    await renewer.renew_once()
    plain = patches(client)[-1]
    assert plain["metadata"]["annotations"] == {PREVIOUS_RENEW: None}  # the evidence is cleared
    assert LAST_OUTAGE not in plain["metadata"]["annotations"]


async def test_unanswered_renewals_that_did_not_land_are_an_outage_from_the_first(
    renewer: Renewer, client: FakeClient, clock: Clock
) -> None:
    await renewer.renew_once()
    client.script = [unanswered(), unanswered(), TransportError("connect", "refused")]
    await renew_every_2s(renewer, clock, 3)
    await renew_every_2s(renewer, clock, 1)  # the evidence: none of them landed
    await renew_every_2s(renewer, clock, 1)  # the record goes with the next plain renewal
    outage = recorded_outage(client)
    assert (outage.failure_class, outage.start, outage.duration_s) == (
        "timeout",
        T0 + timedelta(seconds=102),
        6.0,
    )


async def test_an_outage_after_an_unanswered_renewal_that_landed_starts_after_it(
    renewer: Renewer, client: FakeClient, clock: Clock
) -> None:
    await renewer.renew_once()
    client.script = [unanswered(), Landed(unanswered()), TransportError("dns", "lost"), unanswered()]
    await renew_every_2s(renewer, clock, 4)
    await renew_every_2s(renewer, clock, 2)  # the evidence, then the record
    outage = recorded_outage(client)
    # The second landed at 104: the lease went unrenewed from the third (106) on.
    assert (outage.failure_class, outage.start, outage.duration_s) == (
        "dns",
        T0 + timedelta(seconds=106),
        4.0,
    )


async def test_missing_lease_is_waiting_not_an_outage(
    renewer: Renewer, client: FakeClient, clock: Clock, logs: Logs
) -> None:
    client.script = [NotFound(404, "NotFound", "")] * 3
    for _ in range(3):
        assert await renewer.renew_once() <= 8.0
    assert renewer.state == "waiting"
    assert renewer.metrics.lease_missing.get() == 3
    assert renewer.metrics.failures.samples() == []
    await renewer.renew_once()
    assert events(logs) == ["lease_missing", "lease_renewing"]
    # Still the first success: released is cleared now.
    assert patches(client)[-1]["metadata"]["annotations"] == {RELEASED: None}


async def test_during_a_move_the_old_layouts_lease_is_renewed_too_until_it_is_gone(
    clock: Clock, client: FakeClient, tmp_path: Path, logs: Logs
) -> None:
    """An aggregator of either layout sees this node renew: ours first, then the old one; with no
    lease of ours yet (an old aggregator), the old one at the pace its annotation asks."""
    token = tmp_path / "token"
    token.write_text("t")
    settings = Settings(apiserver_url="https://api.example", node_name="n1", token_file=str(token))
    assert settings.legacy_namespace == "dwd-node-lease"
    renewer = Renewer(settings, client, clock=clock, wall=clock.wall)
    old = "/apis/coordination.k8s.io/v1/namespaces/dwd-node-lease/leases/n1"
    await renewer.renew_once()
    assert [path for path, _ in client.legacy_calls] == [old]
    assert client.legacy_calls[0][1]["spec"] == patches(client)[-1]["spec"]  # the same stamp
    # The old agent released it when it stopped: the first write takes it back, no other.
    assert client.legacy_calls[0][1]["metadata"]["annotations"] == {RELEASED: None}
    await renewer.renew_once()
    assert "metadata" not in client.legacy_calls[1][1]
    client.script = [NotFound(404, "NotFound", "")]
    client.legacy_script = [lease("5s")]
    assert await renewer.renew_once() == 5.0  # not the missing lease's backoff
    assert renewer.state == "waiting"
    # A failed write of it (a timeout) keeps the pace: the old layout is still there.
    client.script = [NotFound(404, "NotFound", "")] * 2
    client.legacy_script = [TransportError("timeout", "no answer"), lease("5s")]
    assert [await renewer.renew_once() for _ in range(2)] == [5.0, 5.0]
    client.legacy_script = [NotFound(404, "NotFound", "namespace dwd-node-lease is gone")]
    await renewer.renew_once()
    calls = len(client.legacy_calls)
    client.script = [NotFound(404, "NotFound", "")] * 2
    waits = [await renewer.renew_once() for _ in range(3)]
    assert len(client.legacy_calls) == calls  # never again
    assert waits[1] > waits[0]  # the missing lease's backoff once more
    assert "legacy_lease_done" in events(logs)


class Top:
    """A random source that always draws the top of the range: the nominal waits."""

    def uniform(self, low: float, high: float) -> float:
        return high


async def test_a_missing_lease_is_polled_ever_more_slowly_then_renewed_at_once(
    renewer: Renewer, client: FakeClient
) -> None:
    """A fresh install of 5000 nodes waits up to 100 s for its leases (50 created a second):
    at the 2 s interval that is 2500 404s a second on KAPI. The wait doubles per 404 in a row
    up to a minute, spread, and a run of them ends with any other answer."""
    renewer.random = Top()
    client.script = [NotFound(404, "NotFound", "")] * 8
    waits = [await renewer.renew_once() for _ in range(8)]
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    await renewer.renew_once()  # the lease is there: renewed, back on the interval
    assert renewer.state == "renewing"
    # A new run of 404s starts again at the interval; throttling within it does not end it.
    client.script = [
        NotFound(404, "NotFound", ""),
        NotFound(404, "NotFound", ""),
        TooManyRequests(429, "", "", None),
    ]
    client.script += [
        NotFound(404, "NotFound", ""),
        TransportError("connect", "refused"),
        NotFound(404, "NotFound", ""),
    ]
    waits = [await renewer.renew_once() for _ in range(6)]
    assert waits[:2] == [2.0, 4.0] and waits[3] == 8.0 and waits[5] == 16.0
    renewer.random = random.Random(7)
    client.script = [NotFound(404, "NotFound", "")] * 20
    spread = [await renewer.renew_once() for _ in range(20)][-10:]
    assert all(30.0 <= w <= 60.0 for w in spread) and len(set(spread)) == 10  # not in step


async def test_throttling_backs_off_as_told_and_is_counted_apart(
    renewer: Renewer, client: FakeClient
) -> None:
    client.script = [
        TooManyRequests(429, "TooManyRequests", "", 5.0),
        TooManyRequests(429, "TooManyRequests", "", None),
        TooManyRequests(429, "TooManyRequests", "", 1.0),
        TooManyRequests(429, "TooManyRequests", "", 3600.0),
    ]
    waits = [await renewer.renew_once() for _ in range(4)]
    assert waits == [5.0, 2.0, 2.0, MAX_BACKOFF_S]
    assert renewer.metrics.throttled.get() == 4
    assert renewer.metrics.failures.samples() == []
    assert len(client.calls) == 4  # a 429 is not retried at once


async def test_adopts_the_interval_from_its_own_patch_response(
    renewer: Renewer, client: FakeClient, logs: Logs
) -> None:
    client.script = [lease("500ms"), lease("10ms"), lease("soon"), lease("soon"), lease(None)]
    assert await renewer.renew_once() == 0.5  # the new pace applies at once
    assert renewer.interval_s == 0.5
    await renewer.renew_once()
    assert renewer.interval_s == 0.2  # clamped
    await renewer.renew_once()
    await renewer.renew_once()
    assert renewer.interval_s == 0.2  # garbage ignored, logged once
    assert events(logs).count("renew_interval_invalid") == 1
    await renewer.renew_once()
    assert renewer.interval_s == 2.0  # annotation gone: back to the configured default
    assert renewer.window_s == 4.0


async def test_run_releases_the_lease_on_stop(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    settings = Settings(
        apiserver_url="https://api.example", node_name="n1", token_file=str(token), renew_interval_s=0.2
    )
    clock = Clock()
    client = FakeClient(clock)
    renewer = Renewer(settings, client)
    stop = asyncio.Event()
    task = asyncio.create_task(renewer.run(stop))
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(task, 2)
    renewals = [body for body in patches(client) if "spec" in body]
    assert 2 <= len(renewals) <= 4
    assert patches(client)[-1] == {"metadata": {"annotations": {RELEASED: "true"}}}
    # During a move the old layout's lease, renewed after ours, is the one judged: released too.
    old = "/apis/coordination.k8s.io/v1/namespaces/dwd-node-lease/leases/n1"
    assert client.legacy_calls[-1] == (old, {"metadata": {"annotations": {RELEASED: "true"}}})
    assert client.closed == 1


async def test_a_release_of_the_old_layouts_lease_is_not_sent_once_it_is_gone(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    settings = Settings(apiserver_url="https://api.example", node_name="n1", token_file=str(token))
    client = FakeClient(Clock())
    renewer = Renewer(settings, client)
    client.legacy_script = [NotFound(404, "NotFound", "namespace dwd-node-lease is gone")]
    await renewer.renew_once()
    stop = asyncio.Event()
    stop.set()
    await renewer.run(stop)
    assert len(client.legacy_calls) == 1
    assert patches(client)[-1] == {"metadata": {"annotations": {RELEASED: "true"}}}


async def test_without_evidence_unanswered_renewals_prove_nothing(
    renewer: Renewer, client: FakeClient, clock: Clock, logs: Logs
) -> None:
    """KAPI refuses the evidence patch (no annotations to copy into): the agent renews plainly
    at once, and reports no outage for renewals that may have landed."""
    await renewer.renew_once()
    client.script = [unanswered(), unanswered(), Invalid(422, "Invalid", "no annotations")]
    for _ in range(2):
        clock.now += 2
        await renewer.renew_once()
    clock.now += 2
    await renewer.renew_once()
    assert [kind for kind, _, _ in client.calls][-2:] == ["json", "merge"]
    assert renewer.state == "renewing"
    assert LAST_OUTAGE not in (patches(client)[-1].get("metadata") or {}).get("annotations", {})
    assert [e["proven"] for e in logs if e["event"] == "renew_recovered"] == [False]


async def test_any_2xx_answer_is_a_renewal_that_landed(
    renewer: Renewer, client: FakeClient, clock: Clock
) -> None:
    """The answer is parsed once into the lease's view (core/lease.py, as the aggregator's);
    one that lacks its name is still the server's yes: the renewal landed, no outage is told."""
    client.script = [{"kind": "Lease", "metadata": {}, "spec": {}}, lease("1m")]
    await renew_every_2s(renewer, clock, 2)
    assert renewer.state == "renewing" and renewer.metrics.renewals.get() == 2
    assert renewer.interval_s == 60.0  # the next answer's interval adopted
    assert all(LAST_OUTAGE not in p.get("metadata", {}).get("annotations", {}) for p in patches(client))


class SlowToRelease(FakeClient):
    """Every release (ours and the first layout's) answered after ``release_s``."""

    release_s = 0.0

    async def patch(self, body: Any, *, window_s: float, path: str = "") -> dict[str, Any]:
        if body == release_patch():
            await asyncio.sleep(self.release_s)
        return await super().patch(body, window_s=window_s, path=path)


@pytest.mark.parametrize(("release_s", "released"), [(1.5, 2), (3.0, 0)])
@in_virtual_time
async def test_both_releases_fit_the_pods_grace_period(
    tmp_path: Path, release_s: float, released: int
) -> None:
    """A loaded API server answering a release in 1.5 s still gets both (1 s gave up on it); one
    that takes longer is given up, and the two leave the agent inside its 5 s grace period."""
    token = tmp_path / "token"
    token.write_text("t")
    settings = Settings(apiserver_url="https://api.example", node_name="n1", token_file=str(token))
    client = SlowToRelease(Clock())
    client.release_s = release_s
    renewer = Renewer(settings, client)
    await renewer.renew_once()
    stop = asyncio.Event()
    stop.set()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with capture_logs() as logs:
        await renewer.run(stop)
    assert loop.time() - began < 5.0
    assert [e["lease"] for e in logs if e["event"] == "lease_released"] == ["own", "legacy"][:released]
    assert len([e for e in logs if e["event"] == "lease_release_failed"]) == 2 - released

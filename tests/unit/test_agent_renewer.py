"""The renewal state machine against a scripted client and a manual clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.renewer import MAX_BACKOFF_S, Renewer
from agent.settings import Settings
from core.errors import NotFound, ServerError, TooManyRequests, TransportError
from core.lease import LAST_OUTAGE, RELEASED, RENEW_INTERVAL, Outage

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


class FakeClient:
    """Answers each PATCH with the next scripted lease or exception."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.script: list[Any] = []
        self.calls: list[tuple[dict[str, Any], bool]] = []
        self.closed = 0
        self.latency_s = 0.0

    async def patch(self, body: dict[str, Any], *, timeout_s: float, fresh: bool = False) -> dict[str, Any]:
        self.calls.append((body, fresh))
        self.clock.now += self.latency_s
        outcome = self.script.pop(0) if self.script else lease()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def reload_tls(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed += 1


def lease(interval: str | None = None) -> dict[str, Any]:
    annotations = {RENEW_INTERVAL: interval} if interval else {}
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
    settings = Settings(apiserver_url="https://api.example", node_name="n1", token_file=str(token))
    return Renewer(settings, client, clock=clock, wall=clock.wall)  # type: ignore[arg-type]


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    with capture_logs() as captured:
        yield captured


def events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["log_level"] != "debug"]


async def test_first_renewal_clears_released_later_ones_do_not(renewer: Renewer, client: FakeClient) -> None:
    assert await renewer.renew_once(deadline=102) == 2.0
    assert await renewer.renew_once(deadline=104) == 2.0
    first, second = client.calls[0][0], client.calls[1][0]
    assert first["metadata"]["annotations"] == {RELEASED: None}
    assert "metadata" not in second
    assert second["spec"] == {"holderIdentity": "n1", "renewTime": "2026-11-30T12:01:40.000000Z"}
    assert renewer.metrics.renewals.get() == 2


async def test_failed_request_is_retried_once_on_a_fresh_connection(
    renewer: Renewer, client: FakeClient
) -> None:
    client.script = [TransportError("connect", "refused")]
    await renewer.renew_once(deadline=102)
    assert [fresh for _, fresh in client.calls] == [False, True]
    assert renewer.state == "renewing"
    assert renewer.metrics.failures.get(**{"class": "connect"}) == 0


async def test_no_retry_when_the_interval_is_used_up(
    renewer: Renewer, client: FakeClient, clock: Clock
) -> None:
    client.latency_s = 1.99
    client.script = [TransportError("timeout", "slow")]
    await renewer.renew_once(deadline=clock.now + 2)
    assert len(client.calls) == 1
    assert renewer.state == "failing"


async def test_outage_logged_once_per_state_change_and_reported_after_recovery(
    renewer: Renewer, client: FakeClient, clock: Clock, logs: list[dict[str, Any]]
) -> None:
    await renewer.renew_once(deadline=clock.now + 2)
    refused = TransportError("connect", "refused")
    client.script = [refused, refused, refused, refused]
    for _ in range(2):
        clock.now += 2
        await renewer.renew_once(deadline=clock.now + 2)
    assert renewer.metrics.failures.get(**{"class": "connect"}) == 2
    client.script = [ServerError(503, "ServiceUnavailable", ""), ServerError(503, "ServiceUnavailable", "")]
    clock.now += 2
    await renewer.renew_once(deadline=clock.now + 2)
    clock.now += 2.5
    await renewer.renew_once(deadline=clock.now + 2)  # recovers
    assert events(logs) == [
        "lease_renewing",
        "renew_failing",
        "renew_failing",
        "renew_recovered",
        "lease_renewing",
    ]
    assert [e.get("failure") for e in logs if e["event"] == "renew_failing"] == ["connect", "http-503"]
    recovering_patch = client.calls[-1][0]
    outage = Outage.from_annotation(recovering_patch["metadata"]["annotations"][LAST_OUTAGE])
    assert outage.failure_class == "connect"  # what began the outage
    assert outage.start == T0 + timedelta(seconds=102)
    assert outage.duration_s == pytest.approx(6.5)
    # Reported once: the next renewal is plain again.
    clock.now += 2
    await renewer.renew_once(deadline=clock.now + 2)
    assert "metadata" not in client.calls[-1][0]


async def test_missing_lease_is_waiting_not_an_outage(
    renewer: Renewer, client: FakeClient, clock: Clock, logs: list[dict[str, Any]]
) -> None:
    client.script = [NotFound(404, "NotFound", "")] * 3
    for _ in range(3):
        assert await renewer.renew_once(deadline=clock.now + 2) == 2.0
    assert renewer.state == "waiting"
    assert renewer.metrics.lease_missing.get() == 3
    assert renewer.metrics.failures.samples() == []
    await renewer.renew_once(deadline=clock.now + 2)
    assert events(logs) == ["lease_missing", "lease_renewing"]
    # Still the first success: released is cleared now.
    assert client.calls[-1][0]["metadata"]["annotations"] == {RELEASED: None}


async def test_throttling_backs_off_as_told_and_is_counted_apart(
    renewer: Renewer, client: FakeClient
) -> None:
    client.script = [
        TooManyRequests(429, "TooManyRequests", "", 5.0),
        TooManyRequests(429, "TooManyRequests", "", None),
        TooManyRequests(429, "TooManyRequests", "", 1.0),
        TooManyRequests(429, "TooManyRequests", "", 3600.0),
    ]
    waits = [await renewer.renew_once(deadline=1e9) for _ in range(4)]
    assert waits == [5.0, 2.0, 2.0, MAX_BACKOFF_S]
    assert renewer.metrics.throttled.get() == 4
    assert renewer.metrics.failures.samples() == []
    assert len(client.calls) == 4  # a 429 is not retried at once


async def test_adopts_the_interval_from_its_own_patch_response(
    renewer: Renewer, client: FakeClient, logs: list[dict[str, Any]]
) -> None:
    client.script = [lease("500ms"), lease("10ms"), lease("soon"), lease("soon"), lease(None)]
    assert await renewer.renew_once(deadline=1e9) == 0.5  # the new pace applies at once
    assert renewer.interval_s == 0.5
    await renewer.renew_once(deadline=1e9)
    assert renewer.interval_s == 0.2  # clamped
    await renewer.renew_once(deadline=1e9)
    await renewer.renew_once(deadline=1e9)
    assert renewer.interval_s == 0.2  # garbage ignored, logged once
    assert events(logs).count("renew_interval_invalid") == 1
    await renewer.renew_once(deadline=1e9)
    assert renewer.interval_s == 2.0  # annotation gone: back to the configured default
    assert renewer.attempt_timeout_s == 1.0


async def test_attempt_timeout_fits_twice_in_the_interval(renewer: Renewer, client: FakeClient) -> None:
    client.script = [lease("1s")]
    await renewer.renew_once(deadline=1e9)
    assert renewer.attempt_timeout_s == 0.5


async def test_run_releases_the_lease_on_stop(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    settings = Settings(
        apiserver_url="https://api.example", node_name="n1", token_file=str(token), renew_interval_s=0.2
    )
    clock = Clock()
    client = FakeClient(clock)
    renewer = Renewer(settings, client)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(renewer.run(stop))
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(task, 2)
    renewals = [body for body, _ in client.calls if "spec" in body]
    assert 2 <= len(renewals) <= 4
    assert client.calls[-1][0] == {"metadata": {"annotations": {RELEASED: "true"}}}
    assert client.closed == 1

"""The connection policy against scripted connections, in virtual time.

Each fake connection answers, fails or hangs as its script says; the policy
under test is the real one, only the network is not. The clock is the event loop's
virtual one (tests/unit/virtualtime.py): a delay takes exactly what its script says and the
bounds below (tenths of a second) hold however loaded the machine; in real time a late timer
moved them. The same behaviours are shown against a real kube-apiserver behind a delaying
proxy in tests/integration/test_agent_path.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent import client as policy
from agent.client import LeaseClient
from agent.origin import ssl_context
from agent.path import Attempt, Connection
from agent.wire import Headers, Request, Response
from core.credentials import TokenFile
from core.errors import TransportError
from tests.unit.virtualtime import in_virtual_time, now

REQ = Request("PATCH", "/lease", {})


class FakeConnection(Connection):
    """Answers after ``delay`` (None: never), or fails with ``error`` after ``delay``; a new
    one first spends ``handshake`` connecting (None: never connects). A Connection to the
    policy (what it reads of one: ``born``, ``answered``, ``request``, ``aclose``), with none of
    its network: Connection's own ``__init__`` is not called."""

    def __init__(
        self,
        delay: float | None,
        error: TransportError | None = None,
        *,
        sent: bool = True,
        handshake: float | None = 0.0,
    ) -> None:
        self.delay = delay
        self.error = error
        self.sent = sent
        self.handshake = handshake
        self.born = now()
        self.answered = 0
        self.closed = False
        self.requests = 0

    async def request(self, req: Request, attempt: Attempt, *, connect_timeout_s: float) -> Response:
        self.requests += 1
        if self.answered == 0:
            attempt.reached = "connect"
            if self.handshake is None:
                await asyncio.Event().wait()
            await asyncio.sleep(self.handshake or 0)
            attempt.phases["connect"] = self.handshake or 0.0
            attempt.reached = "request"
        started = now()
        attempt.sent = self.sent
        if self.delay is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay or 0)
        if self.error is not None:
            raise self.error
        attempt.phases["request"] = now() - started
        attempt.reached = ""
        self.answered += 1
        return Response(200, Headers({}), b"")

    async def aclose(self) -> None:
        self.closed = True


class Net:
    """Hands out the next scripted connection whenever the policy opens one."""

    def __init__(self, *connections: FakeConnection) -> None:
        self.queue = list(connections)
        self.opened: list[FakeConnection] = []

    def __call__(self) -> FakeConnection:
        conn = self.queue.pop(0) if self.queue else FakeConnection(0.01)
        self.opened.append(conn)
        return conn


@pytest.fixture
def client(tmp_path: Path) -> LeaseClient:
    (tmp_path / "token").write_text("t")
    token = TokenFile(tmp_path / "token")
    return LeaseClient("https://api.example", "ns", "n1", token, ssl_context, clock=now)


def script(client: LeaseClient, *connections: FakeConnection) -> Net:
    net = Net(*connections)
    client.new_connection = net  # type: ignore[method-assign]  # the policy's one way to a network
    return net


async def warm_up(client: LeaseClient, conn: FakeConnection) -> None:
    script(client, conn)
    await client.request(REQ, 1.0)
    assert client.warm is conn


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    started = now()
    await fn()
    return now() - started


@in_virtual_time
async def test_a_slow_warm_request_keeps_its_connection(client: LeaseClient) -> None:
    """Slower than the hedge delay but inside the window: the warm connection answers first,
    the connection opened beside it is dropped, and the warm one stays."""
    warm = FakeConnection(0.0)
    await warm_up(client, warm)
    warm.delay = 0.35  # hedge after 0.3 s (half the window); a new connection needs 0.5 s
    net = script(client, FakeConnection(0.5))
    await client.request(REQ, 0.6)
    assert client.warm is warm and not warm.closed
    assert len(net.opened) == 1 and net.opened[0].closed  # hedged beside it, then dropped


@in_virtual_time
async def test_a_dead_warm_connection_is_replaced_by_one_opened_beside_it(client: LeaseClient) -> None:
    """Half-open: the warm connection swallows the request. A new one opened after the hedge
    delay answers within the same window and takes over; only then is the old one dropped."""
    warm = FakeConnection(0.0)
    await warm_up(client, warm)
    warm.delay = None
    fresh = FakeConnection(0.05)
    script(client, fresh)
    took = await timed(lambda: client.request(REQ, 2.0))
    assert client.warm is fresh
    assert 0.5 <= took < 1.0  # hedge floor 0.5 s, then the new connection's 0.05 s
    # Overtaken is not dead: the old one is kept as a spare; asked once and silent, it goes.
    assert client.spare is warm and not warm.closed
    fresh.delay = 0.8
    await client.request(REQ, 2.0)
    # mypy keeps what the asserts above narrowed, across the await that changed it.
    assert client.warm is fresh and client.spare is None and warm.closed  # type: ignore[unreachable]


@in_virtual_time
async def test_on_a_lossy_path_the_spare_answers_for_a_stalled_warm_connection(client: LeaseClient) -> None:
    """Two open connections lose packets independently: when the warm one stalls (TCP backing
    off), the spare is asked at the hedge delay and answers in one round trip; roles swap."""
    first, second = FakeConnection(0.0), FakeConnection(0.0)
    await warm_up(client, first)
    first.delay = 3.0  # stalled
    script(client, second)
    await client.request(REQ, 4.0)  # a new connection overtakes it: the stalled one becomes spare
    assert (client.warm, client.spare) == (second, first)
    first.delay, second.delay = 0.05, 3.0  # now the other one stalls
    net = script(client)
    took = await timed(lambda: client.request(REQ, 4.0))
    assert took < 1.0 and net.opened == []  # the spare answered; no new connection
    assert (client.warm, client.spare) == (first, second)


@in_virtual_time
async def test_a_handshake_lost_on_the_way_gets_a_sibling_beside_it(client: LeaseClient) -> None:
    """A lost SYN costs the kernel's 1 s retransmission and a 3 s retransmission timeout after
    it; a second connection started after 0.5 s, beside the first, gets through at once."""
    net = script(client, FakeConnection(0.01, handshake=None), FakeConnection(0.01, handshake=0.05))
    took = await timed(lambda: client.request(REQ, 4.0))
    assert 0.5 <= took < 0.8 and client.warm is net.opened[1]
    assert net.opened[0].closed  # the stuck handshake is dropped, not left to finish


@in_virtual_time
async def test_siblings_are_bounded_and_follow_the_paths_handshake_time(client: LeaseClient) -> None:
    # A black hole: the first new connection and two siblings, then the window closes.
    net = script(client, *(FakeConnection(None, handshake=None) for _ in range(5)))
    with pytest.raises(TransportError):
        await client.request(REQ, 2.0)
    assert len(net.opened) == 1 + policy.MAX_SIBLINGS
    # A slow path whose handshakes take 0.4 s: no sibling for a handshake of that length.
    client._handshake_times.extend([0.4] * 3)
    net = script(client, FakeConnection(0.01, handshake=0.7))
    await client.request(REQ, 4.0)
    assert len(net.opened) == 1 and client.warm is net.opened[0]


@in_virtual_time
async def test_hedge_delay_follows_the_paths_own_pace(client: LeaseClient) -> None:
    """On a path whose warm requests take 0.3 s the hedge waits 0.6 s: no new connection
    on every renewal of a slow but working path."""
    warm = FakeConnection(0.3)
    await warm_up(client, warm)
    net = script(client)
    for _ in range(3):
        await client.request(REQ, 4.0)
    assert net.opened == [] and client.warm is warm
    # Twice the measured 0.3 s, above the 0.5 s floor; a loaded machine only measures slower.
    hedge = client.plan(4.0)[0].hedge_after_s
    assert hedge is not None and 0.59 <= hedge <= 0.9, hedge


@in_virtual_time
async def test_recycling_is_make_before_break(client: LeaseClient, monkeypatch: pytest.MonkeyPatch) -> None:
    warm = FakeConnection(0.0)
    await warm_up(client, warm)
    monkeypatch.setattr(policy, "MAX_CONNECTION_AGE_S", 0.0)
    # The new connection fails: the warm one still renews, and stays.
    broken = FakeConnection(0.01, TransportError("dns", "lost"), sent=False)
    script(client, broken)
    await client.request(REQ, 2.0)
    assert client.warm is warm and not warm.closed and broken.closed
    # Tried again only after RECYCLE_RETRY_S; then a working new connection takes over.
    monkeypatch.setattr(policy, "RECYCLE_RETRY_S", 0.0)
    client._recycle_at = 0.0
    fresh = FakeConnection(0.01)
    script(client, fresh)
    await client.request(REQ, 2.0)
    # mypy keeps what the assert above narrowed, across the await that changed it.
    assert client.warm is fresh and warm.closed and warm.requests == 2  # type: ignore[unreachable]


@in_virtual_time
async def test_a_lost_dns_answer_costs_one_step_not_the_window(client: LeaseClient) -> None:
    lost = FakeConnection(0.1, TransportError("dns", "timed out"), sent=False)
    script(client, lost, FakeConnection(0.01))
    took = await timed(lambda: client.request(REQ, 4.0))
    assert took < 0.5 and client.warm is not None


@in_virtual_time
async def test_no_answer_within_the_window_is_a_timeout_that_may_have_landed(client: LeaseClient) -> None:
    warm = FakeConnection(0.0)
    await warm_up(client, warm)
    warm.delay = None
    script(client, FakeConnection(None))
    with pytest.raises(TransportError) as e:
        await client.request(REQ, 0.8)
    assert e.value.kind == "timeout" and e.value.sent
    assert [p["connection"] for p in e.value.path] == ["warm", "new"]
    # A slow request is not a broken connection: the warm one is kept, but the next
    # renewal leads with a new connection in case it is dead.
    assert client.warm is warm and not warm.closed
    assert client.plan(4.0)[0].conn is None


@in_virtual_time
async def test_after_an_unanswered_renewal_the_warm_connection_is_asked_beside_a_new_one(
    client: LeaseClient,
) -> None:
    """On a lossy path the warm connection is often the first to get through again: it is asked
    at once beside the new connection, not after the new one has had its chance."""
    warm = FakeConnection(0.0)
    await warm_up(client, warm)
    warm.delay = None
    script(client, FakeConnection(None))
    with pytest.raises(TransportError):
        await client.request(REQ, 0.8)
    warm.delay = 0.2
    net = script(client, FakeConnection(None, handshake=None))
    took = await timed(lambda: client.request(REQ, 4.0))
    assert took < 0.45 and client.warm is warm
    assert len(net.opened) == 1 and net.opened[0].closed


@in_virtual_time
async def test_a_request_never_sent_is_known_to_have_failed(client: LeaseClient) -> None:
    refused = TransportError("connect", "refused", sent=False)
    script(client, FakeConnection(0.0, refused, sent=False), FakeConnection(0.0, refused, sent=False))
    with pytest.raises(TransportError) as e:
        await client.request(REQ, 1.0)
    assert e.value.kind == "connect" and not e.value.sent
    assert client.warm is None


@in_virtual_time
async def test_the_latest_step_names_the_failure(client: LeaseClient) -> None:
    """The load balancer drops the warm connection and DNS is down: the reset is an echo, what a
    new connection meets now (dns) is the cause an operator needs."""
    warm = FakeConnection(0.0)
    await warm_up(client, warm)
    warm.error, warm.sent = TransportError("connect", "reset"), False
    script(client, FakeConnection(0.01, TransportError("dns", "no answer"), sent=False))
    with pytest.raises(TransportError) as e:
        await client.request(REQ, 2.0)
    assert e.value.kind == "dns"


class GatedConnection(FakeConnection):
    """Answers when ``gate`` opens: connections that share a gate answer in the same moment."""

    def __init__(self, gate: asyncio.Event | None) -> None:
        super().__init__(0.0)
        self.gate = gate

    async def request(self, req: Request, attempt: Attempt, *, connect_timeout_s: float) -> Response:
        if self.gate is not None:
            await self.gate.wait()
        return await super().request(req, attempt, connect_timeout_s=connect_timeout_s)


@in_virtual_time
async def test_a_connection_that_answers_beside_the_winner_is_closed_not_forgotten(
    client: LeaseClient,
) -> None:
    """The warm connection and the one hedged beside it answer in the same moment: one wins,
    and the other is kept (as the warm one or the spare) or closed, never left open with
    nothing to use or close it (a socket and a reader task for good)."""
    for _ in range(6):  # which of the two wins depends on the order asyncio hands them back
        warm = GatedConnection(None)
        await warm_up(client, warm)
        warm.gate = gate = asyncio.Event()
        net = script(client, GatedConnection(gate))
        asyncio.get_running_loop().call_later(policy.HEDGE_FLOOR_S + 0.1, gate.set)
        await client.request(REQ, 2.0)
        for conn in (warm, *net.opened):
            assert conn in (client.warm, client.spare) or conn.closed
        await client.aclose()
        client.warm = client.spare = None

"""The agent's connection policy: a slow path keeps working, a broken one is seen as broken.

A request may use its whole window (twice the interval) and races at most three attempts
in it: the warm connection leads, a new one is opened beside it (not after it) when it has
not answered after the hedge delay or is due to be replaced (a minute old: a new DNS
lookup), a handshake that hangs gets a sibling, and the first HTTP answer wins. Recycling is
make-before-break; a connection that was merely slow stays warm, and one overtaken is kept
a minute as a spare. The rules, the numbers and what they buy: docs/agent.md, "The
connection policy".
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agent.origin import Origin
from agent.path import Attempt, Connection, resolve
from agent.settings import Settings
from agent.wire import Request, Response
from core.credentials import TokenFile
from core.errors import BadResponse, TransportError, api_error
from core.lease import lease_name, lease_path

MAX_CONNECTION_AGE_S = 60.0
# A recycle that lost its race against the warm connection is tried again this much later.
RECYCLE_RETRY_S = 15.0
# A spare is kept this long after it last stopped being the warm connection.
SPARE_TTL_S = 60.0
HEDGE_FLOOR_S = 0.5
# Hedging after a new connection waits at least this: a first connection pays DNS,
# TCP and TLS before its request.
NEW_HEDGE_FLOOR_S = 1.0
# A handshake that takes longer than this (or twice the recent median) gets a sibling: well
# before the kernel retransmits a lost SYN (1 s).
HANDSHAKE_HEDGE_FLOOR_S = 0.5
MAX_SIBLINGS = 2
HANDSHAKE_PHASES = ("dns", "connect", "tls")
HISTORY = 8
HANDSHAKE_MARGIN_S = 0.02
# A step that would get less than this of the window is not started: it could not finish.
MIN_STEP_S = 0.1


@dataclass(frozen=True)
class Step:
    """One attempt of the plan: a connection (None: a new one) and how long to give it
    before the next step starts beside it (None: only once it has failed)."""

    conn: Connection | None
    hedge_after_s: float | None


class LeaseClient:
    def __init__(
        self,
        base_url: str,
        namespace: str,
        name: str,
        token: TokenFile,
        tls: Callable[[], ssl.SSLContext],
        *,
        clock: Callable[[], float] = time.monotonic,
        resolver: Callable[[str, int], Any] = resolve,
        server_name: str = "",
    ) -> None:
        self.origin = replace(Origin.from_url(base_url), tls_name=server_name)
        self.path = lease_path(namespace, name)
        self.token = token
        self.tls = tls
        self.clock = clock
        self.resolver = resolver
        self._ssl = tls()
        self.warm: Connection | None = None
        self.spare: Connection | None = None
        self._spare_until = 0.0
        # The warm connection got no answer last time: it may be dead (a half-open
        # connection behind a load balancer that forgot it).
        self._suspect = False
        self._recycle_at = 0.0
        self._warm_times: deque[float] = deque(maxlen=HISTORY)
        self._new_times: deque[float] = deque(maxlen=HISTORY)
        self._handshake_times: deque[float] = deque(maxlen=HISTORY)
        self.connections_opened = 0
        self.on_attempt: Callable[[Attempt], None] = lambda attempt: None

    @classmethod
    def for_settings(cls, settings: Settings) -> LeaseClient:
        return cls(
            settings.apiserver_url,
            settings.lease_namespace,
            lease_name(settings.node_name),
            TokenFile(settings.token_file),
            settings.tls,
            server_name=settings.server_name,
        )

    def reload_tls(self) -> str:
        """Re-read the CA: after a tls failure it may have been rotated. One that cannot be
        read now (a rotation half written, a file replaced by something else) leaves the
        context in use: returns why ("" when read)."""
        try:
            self._ssl = self.tls()
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            return str(e)
        return ""

    async def patch(
        self, body: dict[str, Any] | list[dict[str, Any]], *, window_s: float, path: str = ""
    ) -> dict[str, Any]:
        """Patch the lease (a dict: merge patch, a list: JSON patch), or the one at ``path``;
        returns the lease as stored."""
        content = json.dumps(body, separators=(",", ":")).encode()
        kind = "application/merge-patch+json" if isinstance(body, dict) else "application/json-patch+json"
        return await self._lease("PATCH", path or self.path, content, kind, window_s)

    async def _lease(
        self, method: str, path: str, content: bytes, content_type: str, window_s: float
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token.read()}", "Content-Type": content_type}
        response = await self.request(Request(method, path, headers, content), window_s)
        if response.status_code >= 300:
            raise api_error(response.status_code, response.content, response.headers)
        try:
            obj = response.json()
        except ValueError as e:
            raise BadResponse(f"{method} {path}: response is not JSON") from e
        if not isinstance(obj, dict) or obj.get("kind") != "Lease":
            raise BadResponse(f"{method} {path}: response is not a Lease")
        return obj

    def recycling(self) -> bool:
        """The warm connection is due for replacement: a new one leads, the old one follows."""
        warm = self.warm
        now = self.clock()
        return warm is not None and now - warm.born >= MAX_CONNECTION_AGE_S and now >= self._recycle_at

    def plan(self, window_s: float) -> list[Step]:
        warm, spare = self.warm, self.spare
        warm_hedge = min(max(2 * _median(self._warm_times), HEDGE_FLOOR_S), window_s / 2)
        new_hedge = min(max(1.5 * max(self._new_times, default=0.0), NEW_HEDGE_FLOOR_S), window_s * 0.75)
        if warm is None:
            return [Step(None, None), Step(None, None)]
        if self._suspect and spare is not None:
            return [Step(spare, warm_hedge), Step(None, new_hedge), Step(warm, None)]
        if self._suspect:
            # After a renewal got no answer: dead (half-open) or only lossy, the warm connection
            # is asked at once beside the new one; waiting for the new one first costs a lossy
            # path the window (a new connection needs three round trips).
            return [Step(None, 0.0), Step(warm, None), Step(None, None)]
        if self.recycling():
            return [Step(None, new_hedge), Step(warm, None), Step(None, None)]
        if spare is not None:
            return [Step(warm, warm_hedge), Step(spare, warm_hedge), Step(None, warm_hedge)]
        return [Step(warm, warm_hedge), Step(None, None)]

    def handshake_hedge(self, window_s: float) -> float:
        # A handshake waits on no etcd commit: its fastest recent time is the path's own cost,
        # and one that takes twice that has lost a packet.
        fastest = min(self._handshake_times, default=0.0)
        return min(max(2 * fastest, HANDSHAKE_HEDGE_FLOOR_S), window_s * 0.75)

    async def request(self, req: Request, window_s: float) -> Response:
        """The first HTTP answer any step of the plan gets within the window."""
        if self.spare is not None and self.clock() >= self._spare_until:
            await self.drop(self.spare)
        recycling = self.recycling() and not self._suspect
        race = _Race(self, req, self.clock() + window_s, self.plan(window_s), self.handshake_hedge(window_s))
        winner = None
        try:
            winner = await race.run()
        finally:
            unanswered = await race.stop()
        if winner is None:
            self._suspect = self.warm is not None
            raise _failure(race.failures, unanswered, window_s)
        return await self._won(*winner, replaces_warm=recycling)

    def new_connection(self) -> Connection:
        self.connections_opened += 1
        return Connection(self.origin, self._ssl, clock=self.clock, resolver=self.resolver)

    async def _won(
        self, conn: Connection, attempt: Attempt, response: Response, *, replaces_warm: bool
    ) -> Response:
        # A request on a new connection takes what one on a warm connection will.
        self._warm_times.append(attempt.phases.get("request", 0.0))
        if attempt.new:
            self._new_times.append(sum(attempt.phases.values()))
            self._handshake_times.append(sum(attempt.phases.get(p, 0.0) for p in HANDSHAKE_PHASES))
        if conn is self.spare:
            self.spare, self.warm = self.warm, conn
        elif conn is not self.warm:
            old, self.warm = self.warm, conn
            if old is not None and not replaces_warm:
                await self._keep_as_spare(old)
            elif old is not None:
                await old.aclose()
        elif self.clock() - conn.born >= MAX_CONNECTION_AGE_S:
            self._recycle_at = self.clock() + RECYCLE_RETRY_S
        self._suspect = False
        return response

    async def _keep_as_spare(self, conn: Connection) -> None:
        if self.spare is not None:
            await self.spare.aclose()
        self.spare, self._spare_until = conn, self.clock() + SPARE_TTL_S

    async def drop(self, conn: Connection) -> None:
        if conn is self.warm:
            # The spare, if any, is the next best thing: it has answered before.
            self.warm, self.spare = self.spare, None
        elif conn is self.spare:
            self.spare = None
        await conn.aclose()

    async def aclose(self) -> None:
        for conn in (self.warm, self.spare):
            if conn is not None:
                await self.drop(conn)


class _Race:
    """The steps of one plan, side by side, until one gets an answer or the window closes."""

    def __init__(
        self, client: LeaseClient, req: Request, deadline: float, plan: list[Step], handshake_hedge_s: float
    ) -> None:
        self.client = client
        self.req = req
        self.deadline = deadline
        self.plan = plan
        self.handshake_hedge_s = handshake_hedge_s
        self.running: dict[asyncio.Task[Response], tuple[Connection, Attempt]] = {}
        self.failures: list[TransportError] = []
        self.next_at = client.clock()
        self.siblings = 0
        # When each new connection started, for the handshake hedge.
        self._handshake_started: dict[asyncio.Task[Response], float] = {}

    def _start(self, step: Step, now: float) -> None:
        self._launch(step.conn, now)
        self.next_at = now + step.hedge_after_s if step.hedge_after_s is not None else float("inf")

    def _launch(self, conn: Connection | None, now: float) -> None:
        conn = conn or self.client.new_connection()
        attempt = Attempt(new=conn.answered == 0, reached="dns" if conn.answered == 0 else "request")
        # The handshake times out itself just before the window closes (agent/path.py says why).
        connect_timeout = self.deadline - now - HANDSHAKE_MARGIN_S
        task = asyncio.create_task(conn.request(self.req, attempt, connect_timeout_s=connect_timeout))
        self.running[task] = (conn, attempt)
        if attempt.new:
            self._handshake_started[task] = now

    def _sibling_at(self) -> float:
        """When a sibling is due beside the new connections still in their handshake."""
        if self.siblings >= MAX_SIBLINGS:
            return float("inf")
        starts = self._handshake_started.items()
        handshaking = [at for task, at in starts if self.running[task][1].reached in HANDSHAKE_PHASES]
        at = max(handshaking, default=float("inf")) + self.handshake_hedge_s
        return at if self.deadline - at >= MIN_STEP_S else float("inf")

    async def run(self) -> tuple[Connection, Attempt, Response] | None:
        clock = self.client.clock
        while True:
            now = clock()
            can_start = bool(self.plan) and self.deadline - max(now, self.next_at) >= MIN_STEP_S
            if can_start and (not self.running or now >= self.next_at):
                self._start(self.plan.pop(0), now)
                continue
            sibling_at = self._sibling_at()
            if now >= sibling_at:
                self.siblings += 1
                self._launch(None, now)
                continue
            if not self.running or now >= self.deadline:
                return None
            wake = min(self.deadline, self.next_at if can_start else self.deadline, sibling_at)
            done, _ = await asyncio.wait(
                self.running, timeout=max(0.0, wake - now), return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                conn, attempt = self.running.pop(task)
                self._handshake_started.pop(task, None)
                self.client.on_attempt(attempt)
                try:
                    return conn, attempt, task.result()
                except TransportError as e:
                    self.failures.append(e)
                    await self.client.drop(conn)
                    self.next_at = clock()  # a failed step makes room for the next at once

    async def stop(self) -> list[Attempt]:
        """Cancel what still runs; returns their attempts. The warm connection survives a slow
        request (the winner decides its role); every other is dropped: a spare that stayed
        silent when asked, a new one that never got through, and one that answered in the same
        moment as the winner (nothing would ever use or close it)."""
        for task in self.running:
            task.cancel()
        unanswered = []
        for task, (conn, attempt) in self.running.items():
            await asyncio.gather(task, return_exceptions=True)
            self.client.on_attempt(attempt)
            unanswered.append(attempt)
            if conn is not self.client.warm:
                await self.client.drop(conn)
        return unanswered


def _median(xs: deque[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def _failure(failures: list[TransportError], unanswered: list[Attempt], window_s: float) -> TransportError:
    sent = any(a.sent for a in unanswered) or any(f.sent for f in failures)
    if unanswered:
        # Still waiting when the window closed: the step each hung in says where.
        path = tuple(a.summary() for a in unanswered) + _paths(failures)
        return TransportError("timeout", f"no answer within {window_s:g}s", sent=sent, path=path)
    # The latest step is the freshest word on the path: a warm connection's reset is often the
    # echo of the fault a new connection then meets (a cut load balancer, then no DNS).
    last = failures[-1]
    return TransportError(last.kind, str(last).split(": ", 1)[-1], sent=sent, path=_paths(failures))


def _paths(failures: list[TransportError]) -> tuple[dict[str, Any], ...]:
    return tuple(p for f in failures for p in f.path)

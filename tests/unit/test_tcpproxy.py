"""The load balancer stand-in's slow and broken modes, against an echo server on loopback:
the delays are what a path of that RTT costs, and they never throttle or serialise."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from testenv.net.tcpproxy import TcpProxy

RTT = 0.4
# Loopback and two threads on a 2-core machine that builds Go beside the tests: up to three
# quarters of an RTT late is noise (0.08 s of 0.2 s failed CI so), and still tells one RTT from
# two, and a stream's one RTT from its twenty chunks' twenty.
SLACK = 0.75 * RTT


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        while data := conn.recv(65536):
            conn.sendall(data)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    server = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    p = TcpProxy(upstream=server.getsockname()).open()
    try:
        yield p
    finally:
        p.shutdown()
        server.close()


def connect(p: TcpProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def round_trip(s: socket.socket, payload: bytes = b"ping") -> float:
    t0 = time.monotonic()
    s.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += s.recv(65536)
    assert got == payload
    return time.monotonic() - t0


def test_no_delay_by_default(proxy: TcpProxy) -> None:
    with connect(proxy) as s:
        assert round_trip(s) < SLACK


def test_a_round_trip_costs_the_added_rtt_and_a_new_connection_one_more(proxy: TcpProxy) -> None:
    proxy.delay_s = RTT
    # From before the connect: the proxy counts the handshake's round trip from its accept, and
    # a loaded machine may start round_trip's clock after that (0.795 s for a 0.8 s bound).
    started = time.monotonic()
    with connect(proxy) as s:
        round_trip(s)  # the handshake's round trip, then the request's
        first = time.monotonic() - started
        again = round_trip(s)
    assert 2 * RTT <= first < 2 * RTT + SLACK, first
    assert RTT <= again < RTT + SLACK, again


def test_the_delay_changes_at_runtime_on_open_connections(proxy: TcpProxy) -> None:
    with connect(proxy) as s:
        round_trip(s)
        proxy.delay_s = RTT
        slow = round_trip(s)
        proxy.delay_s = 0
        fast = round_trip(s)
    assert RTT <= slow < RTT + SLACK, slow
    assert fast < SLACK, fast


def test_delay_does_not_throttle_a_stream(proxy: TcpProxy) -> None:
    """Twenty chunks sent back to back all arrive one RTT later, not twenty RTTs later: the
    last one an RTT after it was sent, however long the sending took (on a loaded machine the
    twenty 5 ms sleeps between them stretch; counted at 5 ms each, 0.84 s failed a 0.8 s bound)."""
    proxy.delay_s = RTT
    last_sent = 0.0
    with connect(proxy) as s:
        round_trip(s)
        for i in range(20):
            last_sent = time.monotonic()  # before it goes: the proxy may read it at once
            s.sendall(bytes([i]) * 1000)
            time.sleep(0.005)
        got = b""
        while len(got) < 20_000:
            got += s.recv(65536)
        elapsed = time.monotonic() - last_sent
    assert got == b"".join(bytes([i]) * 1000 for i in range(20))  # in order
    assert RTT <= elapsed < RTT + SLACK, elapsed


def test_connections_do_not_wait_for_each_other(proxy: TcpProxy) -> None:
    proxy.delay_s = RTT
    socks = [connect(proxy) for _ in range(5)]
    times: list[float] = []
    threads = [threading.Thread(target=lambda s=s: times.append(round_trip(s))) for s in socks]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    for s in socks:
        s.close()
    assert elapsed < 2 * RTT + SLACK, (elapsed, times)


def test_blackhole_accepts_and_forwards_nothing_until_a_new_connection(proxy: TcpProxy) -> None:
    before = connect(proxy)
    round_trip(before)
    proxy.blackhole = True
    before.settimeout(0.5)
    before.sendall(b"lost")
    with pytest.raises(TimeoutError):
        before.recv(100)  # no answer, and no close either: half-open
    during = connect(proxy)  # the handshake still succeeds
    during.settimeout(0.5)
    during.sendall(b"lost too")
    with pytest.raises(TimeoutError):
        during.recv(100)

    proxy.blackhole = False
    for dead in (before, during):  # what the blackhole had stays dead
        dead.sendall(b"still lost")
        with pytest.raises(TimeoutError):
            dead.recv(100)
        dead.close()
    with connect(proxy) as after:
        assert round_trip(after) < SLACK


def assert_dropped(s: socket.socket) -> None:
    """The proxy closed or reset this connection."""
    try:
        data = s.recv(100)
    except ConnectionResetError:
        data = b""
    assert data == b""
    s.close()


def test_close_and_open_still_cut_connections(proxy: TcpProxy) -> None:
    s = connect(proxy)
    round_trip(s)
    proxy.close()
    assert_dropped(s)
    with pytest.raises(OSError):
        connect(proxy)
    proxy.open()
    with connect(proxy) as s2:
        round_trip(s2)


def test_cut_drops_connections_and_keeps_listening(proxy: TcpProxy) -> None:
    s = connect(proxy)
    round_trip(s)
    proxy.cut()
    assert_dropped(s)
    with connect(proxy) as again:  # at once: never refused
        round_trip(again)

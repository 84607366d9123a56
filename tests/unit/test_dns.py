"""The test DNS server's slow and lossy modes, on loopback."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from testenv.controlplane import free_port
from testenv.dns import DnsServer


def query(ident: int, name: str = "api.shoot.dwd.test") -> bytes:
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    server = DnsServer(lambda _name, _address: "10.0.0.1", ["127.0.0.1"], port=free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(dns: DnsServer) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.1", dns.port))
        s.settimeout(2)
        yield s


def answers(s: socket.socket, wait_s: float) -> dict[int, float]:
    """Answer ids and when each came, until nothing more comes for ``wait_s``."""
    got: dict[int, float] = {}
    s.settimeout(wait_s)
    while True:
        try:
            data = s.recv(512)
        except TimeoutError:
            return got
        got[struct.unpack("!H", data[:2])[0]] = time.monotonic()


def test_answers_come_late_and_do_not_hold_up_other_queries(dns: DnsServer, client: socket.socket) -> None:
    dns.delay_s = 0.5
    t0 = time.monotonic()
    client.send(query(1))
    time.sleep(0.2)
    client.send(query(2))
    got = answers(client, 1.0)
    assert set(got) == {1, 2}
    assert 0.5 <= got[1] - t0 < 0.6, got[1] - t0
    assert 0.7 <= got[2] - t0 < 0.8, got[2] - t0  # its own 500 ms, not queued behind the first


def test_dropped_queries_are_never_answered(dns: DnsServer, client: socket.socket) -> None:
    dns.drop = 0.3
    for i in range(300):
        client.send(query(i))
        time.sleep(0.001)  # a real lost packet, not one the receive buffer had no room for
    got = answers(client, 0.5)
    assert dns.queries == 300
    assert dns.dropped == 300 - len(got)
    assert 45 <= dns.dropped <= 135, dns.dropped  # 90 expected; 6 standard deviations either side
    dns.drop = 0.0
    client.send(query(1000))
    assert set(answers(client, 0.5)) == {1000}

"""A tiny authoritative DNS server for tests: A records from a dict that tests may change.

It answers on the host side of each node namespace, so a node resolves the
KAPI's external name over a real resolver and a test can stop DNS or tamper
with its answers. TTL 0: every lookup asks again.

A slow or lossy resolver is settable at runtime: ``delay_s`` sends every answer
that much later (from a timer, so other queries are answered meanwhile), and
``drop`` is the share of queries never answered, like a lost UDP packet.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import random
import socket
import struct
import threading
from collections.abc import Callable


def _qname(packet: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    while True:
        length = packet[offset]
        offset += 1
        if length == 0:
            return ".".join(labels).lower(), offset
        labels.append(packet[offset : offset + length].decode(errors="replace"))
        offset += length


def answer(query: bytes, resolve: Callable[[str], str | None]) -> bytes | None:
    """The response to one query: the A record ``resolve`` gives, NXDOMAIN when it gives none."""
    if len(query) < 12:
        return None
    ident, _flags, qdcount = struct.unpack("!HHH", query[:6])
    if qdcount != 1:
        return None
    name, end = _qname(query, 12)
    qtype, _qclass = struct.unpack("!HH", query[end : end + 4])
    question = query[12 : end + 4]
    ip = resolve(name)
    if ip is None:
        return struct.pack("!HHHHHH", ident, 0x8403, 1, 0, 0, 0) + question  # NXDOMAIN
    if qtype != 1:  # AAAA and the rest: the name exists, no such record
        return struct.pack("!HHHHHH", ident, 0x8400, 1, 0, 0, 0) + question
    rr = struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + ipaddress.IPv4Address(ip).packed
    return struct.pack("!HHHHHH", ident, 0x8400, 1, 1, 0, 0) + question + rr


def _timer(delay_s: float, send: Callable[[], None]) -> None:
    timer = threading.Timer(delay_s, send)
    timer.daemon = True
    timer.start()


class DnsServer:
    """Answers on each address with ``resolve(name, address)``: a test can give every node
    the load balancer it can reach, or something else."""

    def __init__(
        self, resolve: Callable[[str, str], str | None], addresses: list[str], port: int = 53
    ) -> None:
        self.resolve = resolve
        self.addresses = addresses
        self.port = port
        self.queries = 0
        self.dropped = 0
        self.delay_s = 0.0
        # Sends an answer ``delay_s`` after its query, each on a timer of its own (none waits
        # behind another); a test may hold them instead (tests/unit/test_dns.py).
        self.later: Callable[[float, Callable[[], None]], None] = _timer
        self.drop = 0.0
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> DnsServer:
        for address in self.addresses:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((address, self.port))
            self._socks.append(sock)
            t = threading.Thread(target=self._serve, args=(sock, address), daemon=True, name=f"dns-{address}")
            t.start()
            self._threads.append(t)
        return self

    def _serve(self, sock: socket.socket, address: str) -> None:
        with contextlib.suppress(OSError):
            while True:
                query, peer = sock.recvfrom(512)
                self.queries += 1
                if random.random() < self.drop:
                    self.dropped += 1
                    continue
                response = answer(query, lambda name: self.resolve(name, address))
                if response is None:
                    continue
                if self.delay_s > 0:
                    self.later(self.delay_s, functools.partial(self._send, sock, response, peer))
                else:
                    sock.sendto(response, peer)

    @staticmethod
    def _send(sock: socket.socket, response: bytes, peer: tuple[str, int]) -> None:
        with contextlib.suppress(OSError):  # stopped meanwhile: the answer is lost with the server
            sock.sendto(response, peer)

    def stop(self) -> None:
        """Close every socket: queries now get ICMP port unreachable, as from a dead server."""
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for t in self._threads:
            t.join(2)
        self._socks.clear()
        self._threads.clear()

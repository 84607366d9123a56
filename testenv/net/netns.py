"""Network namespaces for tests: a "node" with its own network stack, resolver and hosts file.

Each namespace gets one veth pair to the host and no default route, so no
packet can leave the machine. ``ip netns exec`` bind-mounts
/etc/netns/NAME/{hosts,resolv.conf} over /etc, which is how a node resolves
the KAPI's external name to the test load balancer. Needs root.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


def available() -> str:
    """ "" when network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is missing (make deps)"
    return ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def addresses_in_use() -> set[str]:
    """Every IPv4 address on this host's interfaces: a new one must not repeat one (a repeat
    makes a second load balancer fail to bind, or routes a node's packets to another)."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True, text=True)
    return {line.split()[3].split("/")[0] for line in out.stdout.splitlines()}


def unused(make: Callable[[], str]) -> str:
    """An address from ``make`` that no interface here has yet."""
    taken = addresses_in_use()
    while (address := make()) in taken:
        pass
    return address


# Names are unique within this process (random ones collided in worlds of ten nodes); the random
# start keeps apart a later process that got the same pid as one that left something behind.
_SERIAL = itertools.count(random.randrange(1000))


class NetNs:
    def __init__(self, hosts: dict[str, str] | None = None, *, resolver: bool = False) -> None:
        """``resolver``: resolve names through a DNS server on the host side of the veth."""
        tag = f"{os.getpid() % 10000:04d}{next(_SERIAL) % 1000:03d}"
        self.name = f"dwd-{tag}"
        self.host_if, self.ns_if = f"dwdh{tag}", f"dwdn{tag}"
        # A /30 of 10.213.0.0/16: host side .1, node side .2.
        self.host_ip = unused(lambda: f"10.213.{random.randrange(256)}.{random.randrange(64) * 4 + 1}")
        self.ns_ip = self.host_ip.rsplit(".", 1)[0] + f".{int(self.host_ip.rsplit('.', 1)[1]) + 1}"
        self.etc = Path("/etc/netns") / self.name
        self.hosts = hosts or {}
        self.resolver = resolver

    def create(self) -> NetNs:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            _ip("netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up")
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            self.etc.mkdir(parents=True, exist_ok=True)
            self.write_hosts(self.hosts)
            # The test's DNS server on the host side, or nobody: a name not in hosts fails fast.
            nameserver = self.host_ip if self.resolver else "127.0.0.1"
            (self.etc / "resolv.conf").write_text(f"nameserver {nameserver}\noptions timeout:1 attempts:1\n")
        except BaseException:
            self.delete()
            raise
        return self

    def write_hosts(self, hosts: dict[str, str]) -> None:
        self.hosts = dict(hosts)
        lines = ["127.0.0.1 localhost"] + [f"{ip} {name}" for name, ip in hosts.items()]
        (self.etc / "hosts").write_text("\n".join(lines) + "\n")

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside the namespace: for ``testenv.base.process.spawn``, which starts and
        logs it as it does any other program (the namespace changes where it runs, not how)."""
        return ["ip", "netns", "exec", self.name, *command]

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        shutil.rmtree(self.etc, ignore_errors=True)

"""The impostor TLS server of testenv/worlds/networld.py lets go of its address when closed: a later
world may draw the same address (the CI run of 2026-12-02 failed binding one, 'Address already
in use', after the world that had it was closed)."""

from __future__ import annotations

import socket
from pathlib import Path

from testenv.kube.controlplane import free_port
from testenv.worlds.networld import ImpostorTls


def test_a_closed_impostor_frees_its_address_for_the_next(tmp_path: Path) -> None:
    address = "127.0.0.77"
    port = free_port(address)
    ImpostorTls(address, tmp_path / "first", port=port).close()
    # create_server sets SO_REUSEADDR, so a connection in TIME_WAIT cannot fail this: a listener
    # left behind can.
    with socket.create_server((address, port)):
        pass

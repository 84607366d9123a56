"""The agent's process around its renewer: what must not stop the renewals."""

from __future__ import annotations

import socket

from agent.__main__ import metrics_server
from core.metrics import Registry


async def test_a_metrics_port_held_by_another_process_costs_the_metrics_not_the_agent() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert await metrics_server(Registry(), ("127.0.0.1", port)) is None
    server = await metrics_server(Registry(), ("127.0.0.1", 0))
    assert server is not None
    server.close()
    await server.wait_closed()
    assert await metrics_server(Registry(), None) is None

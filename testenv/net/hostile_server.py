"""A server that misbehaves on purpose, for bench/agent_hostile.py:

    python -m testenv.net.hostile_server silent|headers|pings CERT KEY PORT_FILE

It listens on loopback TLS, writes its port to PORT_FILE and serves until killed."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
from pathlib import Path

import h2.config
import h2.connection


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await reader.read(65536):
        pass


async def headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\n")
    i = 0
    while not writer.is_closing():  # until the agent gives up on the connection
        writer.write(b"X-Header-%d: %s\r\n" % (i, b"a" * 100))
        await writer.drain()
        i += 1


async def pings(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    conn.receive_data(await reader.read(65536))
    writer.write(conn.data_to_send())
    while not writer.is_closing():
        for _ in range(100):
            conn.ping(b"12345678")
        writer.write(conn.data_to_send())
        await writer.drain()


async def main(mode: str, cert: str, key: str, port_file: Path) -> None:
    handler = {"silent": silent, "headers": headers, "pings": pings}[mode]
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    if mode == "pings":
        ctx.set_alpn_protocols(["h2"])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            await handler(reader, writer)

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    # Written once before serving: nothing else runs on the loop yet.
    with open(port_file, "w", encoding="utf-8") as f:  # noqa: ASYNC230
        f.write(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])))

"""A TCP forwarder in a background thread: a stand-in for a load balancer that tests can cut,
slow down or blackhole.

TLS passes through untouched, so the client still verifies the API server's
own certificate. ``close()`` stops listening and drops open connections, which
is what a dead load balancer looks like to a client.

``delay_s`` adds that much round-trip time, settable at runtime: every chunk is
held half of it in each direction. Each direction of each connection has its own
queue of chunks with release times, so a slow path delays bytes without
throttling them, and one direction or connection never waits for another. A new
connection also pays one extra round trip before its first byte is forwarded:
the client connects to this proxy at once, but over a real path of that RTT its
TCP handshake would have taken that long.

``blackhole`` is the load balancer that accepts connections and forwards
nothing ("half-open": the backend is gone). New connections still complete
their handshake and every byte sent is accepted and discarded; no byte and no
close ever comes back. The connections open when it is switched on, and those
accepted while it is on, stay dead after it is switched off (their byte streams
lost data, and a client must notice and reconnect, as after a real backend
failure); connections accepted after that are forwarded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

CHUNK = 65536
# A chunk, or None for the end of the stream; with the loop time it may be forwarded.
Item = tuple[float, bytes | None]


@dataclass(eq=False)
class _Link:
    """One client connection and, unless it was accepted into a blackhole, its upstream."""

    client: asyncio.StreamWriter
    accepted_at: float
    handshake_s: float
    upstream: asyncio.StreamWriter | None = None
    dead: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]

    def kill(self) -> None:
        """Backend gone: the upstream is dropped, the client is left hanging."""
        self.dead = True
        if self.upstream is not None:
            self.upstream.transport.abort()


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.upstream = upstream
        self.listen = listen
        self.connections = 0
        # Added round-trip time in seconds; read for every chunk, so a change applies at once.
        self.delay_s = 0.0
        self._blackhole = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcpproxy", daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()

    @property
    def port(self) -> int:
        return self.listen[1]

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    @property
    def blackhole(self) -> bool:
        return self._blackhole

    @blackhole.setter
    def blackhole(self, on: bool) -> None:
        # In the proxy's loop, so that once this returns not one more byte is forwarded.
        self._call(self._set_blackhole(on))

    async def _set_blackhole(self, on: bool) -> None:
        self._blackhole = on
        if on:
            for link in self._links:
                link.kill()

    def open(self) -> TcpProxy:
        self._call(self._open())
        return self

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._handle, *self.listen, reuse_address=True)
        self.listen = (self.listen[0], self._server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        link = _Link(writer, self._loop.time(), self.delay_s)
        self._links.add(link)
        try:
            if self._blackhole:
                link.dead = True
                await self._swallow(reader)
                return
            try:
                up_reader, link.upstream = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            up: asyncio.Queue[Item] = asyncio.Queue()
            down: asyncio.Queue[Item] = asyncio.Queue()
            link.tasks = [
                asyncio.create_task(self._read(reader, up, link, towards_upstream=True)),
                asyncio.create_task(self._write(up, link.upstream, link)),
                asyncio.create_task(self._read(up_reader, down, link, towards_upstream=False)),
                asyncio.create_task(self._write(down, writer, link)),
            ]
            # On a dead link this lasts until the client gives up: it never hears a close.
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            for w in link.writers():
                w.transport.abort()

    @staticmethod
    async def _swallow(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(CHUNK):
                pass

    def _release_at(self, link: _Link, received: float, towards_upstream: bool) -> float:
        half = self.delay_s / 2
        connected = link.accepted_at + link.handshake_s
        if towards_upstream:
            # The client could only have sent once its handshake was done.
            return max(received, connected) + half
        # The server's SYN-ACK reached the client one RTT after the SYN: nothing earlier.
        return max(received + half, connected)

    async def _read(
        self, src: asyncio.StreamReader, queue: asyncio.Queue[Item], link: _Link, *, towards_upstream: bool
    ) -> None:
        last = 0.0
        with contextlib.suppress(OSError):
            while data := await src.read(CHUNK):
                if link.dead:
                    if towards_upstream:
                        continue  # accepted and discarded, until the client gives up
                    break  # the upstream was dropped
                # Never earlier than the chunk before: a lowered delay must not reorder bytes.
                last = max(last, self._release_at(link, self._loop.time(), towards_upstream))
                queue.put_nowait((last, data))
        queue.put_nowait((max(last, self._release_at(link, self._loop.time(), towards_upstream)), None))

    async def _write(self, queue: asyncio.Queue[Item], dst: asyncio.StreamWriter, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while True:
                release, data = await queue.get()
                wait = release - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if link.dead:
                    return  # whatever was in flight when the backend went is lost
                if data is None:
                    break
                dst.write(data)
                await dst.drain()
        if not link.dead:
            dst.close()

    def close(self) -> None:
        """Stop listening (new connections are refused) and cut every open connection."""
        self._call(self._close())

    def cut(self) -> None:
        """Cut every open connection and keep listening: a client that reconnects at once is
        never refused (close() then open() would refuse it for a moment)."""
        self._call(self._cut())

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        await self._cut()

    async def _cut(self) -> None:
        for link in list(self._links):
            for task in link.tasks:
                task.cancel()
            for w in link.writers():
                w.transport.abort()
        self._links.clear()

    async def _finish(self) -> None:
        """Let every connection's task end before the loop goes: none is left pending."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def shutdown(self) -> None:
        self.close()
        self._call(self._finish())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

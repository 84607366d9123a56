"""A TCP forwarder in a background thread: a stand-in for a load balancer that tests can cut.

TLS passes through untouched, so the client still verifies the API server's
own certificate. ``close()`` stops listening and drops open connections, which
is what a dead load balancer looks like to a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.upstream = upstream
        self.listen = listen
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcpproxy", daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        return self.listen[1]

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    def open(self) -> TcpProxy:
        self._call(self._open())
        return self

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._handle, *self.listen, reuse_address=True)
        self.listen = (self.listen[0], self._server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    def close(self) -> None:
        """Stop listening (new connections are refused) and cut every open connection."""
        self._call(self._close())

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def shutdown(self) -> None:
        self.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

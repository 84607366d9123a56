"""The HTTP a renewal speaks on one TLS connection: HTTP/2 (h2's state machine on an asyncio
stream), or HTTP/1.1 where the server offers only that.

The agent needs a small part of HTTP: a request with a small body, its status, headers
and body, on a connection kept open for a minute; a request cancelled from outside must
leave an HTTP/2 connection usable (its stream is reset, the connection stays warm). A
general client (httpx and what it imports: email, http.cookiejar, urllib.request, anyio,
certifi, idna) cost 11 MiB of the agent's memory on every node for none of that
(docs/measured.md); this is the part it used.

Every failure is an OSError (WireError for what the server got wrong), so the caller's
classification sees one family.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    ResponseReceived,
    StreamEnded,
    StreamReset,
)
from h2.exceptions import H2Error

READ_SIZE = 65536
# A response larger than this is not a Lease: the connection is dropped rather than buffered.
MAX_RESPONSE_BYTES = 1 << 20
MAX_HEADER_LINE = 8192


class WireError(ConnectionError):
    """The server broke the protocol, or closed the connection under a request."""


class Headers(Mapping[str, str]):
    """Response headers, looked up in any case as HTTP's are."""

    def __init__(self, pairs: Mapping[str, str]) -> None:
        self._d = {k.lower(): v for k, v in pairs.items()}

    def __getitem__(self, key: str) -> str:
        return self._d[key.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: Headers
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    content: bytes | None = None


class Wire:
    """One open connection's HTTP. ``sent`` is called once the request is handed to the
    socket (the server may then have applied it even if no answer comes back)."""

    usable = True

    async def send(self, req: Request, authority: str, sent: Callable[[], None]) -> Response:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def open_wire(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Wire:
    """HTTP/2 where TLS negotiated it (ALPN), else HTTP/1.1."""
    ssl_object = writer.get_extra_info("ssl_object")
    protocol = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
    return H2Wire(reader, writer) if protocol == "h2" else H1Wire(reader, writer)


@dataclass
class _Stream:
    answer: asyncio.Future[Response]
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


class H2Wire(Wire):
    """Requests as streams of one HTTP/2 connection; a reader task answers them as frames
    arrive (and acknowledges the server's settings, pings and data as the protocol wants)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        # Header values as bytes, decoded as latin-1 (what HTTP allows) by _text: h2's own decoding
        # would fail the whole connection on one header that is not UTF-8.
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.streams: dict[int, _Stream] = {}
        self._flush()
        self._reading = asyncio.get_running_loop().create_task(self._read())

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)

    async def send(self, req: Request, authority: str, sent: Callable[[], None]) -> Response:
        if not self.usable:
            raise WireError("the connection is closed")
        headers = [(":method", req.method), (":authority", authority), (":scheme", "https")]
        headers.append((":path", req.path))
        headers += [(k.lower(), v) for k, v in req.headers.items() if k.lower() != "host"]
        body = req.content or b""
        # A renewal's body is a few hundred bytes: one frame, well inside the initial window.
        if len(body) > min(self.h2.max_outbound_frame_size, self.h2.outbound_flow_control_window):
            raise WireError(f"a request body of {len(body)} bytes does not fit one frame")
        try:
            sid = self.h2.get_next_available_stream_id()
            self.h2.send_headers(sid, headers, end_stream=not body)
            if body:
                self.h2.send_data(sid, body, end_stream=True)
        except H2Error as e:
            self.usable = False
            raise WireError(f"HTTP/2: {e}") from e
        stream = self.streams[sid] = _Stream(asyncio.get_running_loop().create_future())
        try:
            self._flush()
            await self.writer.drain()
            sent()
            return await stream.answer
        except asyncio.CancelledError:
            # Cancelled from outside (the window closed, or another attempt won): only this
            # stream ends, the connection stays warm.
            if self.usable:
                with contextlib.suppress(H2Error):
                    self.h2.reset_stream(sid, ErrorCodes.CANCEL)
                    self._flush()
            raise
        finally:
            self.streams.pop(sid, None)

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    raise WireError("the server closed the connection")
                try:
                    events = self.h2.receive_data(data)
                except H2Error as e:
                    raise WireError(f"HTTP/2: {e}") from e
                for event in events:
                    self._on(event)
                self._flush()
        except asyncio.CancelledError:
            self._fail(WireError("the connection is closed"))
            raise
        except Exception as e:
            self._fail(e)
            self._flush()  # the GOAWAY h2 queued for a protocol error, if any
            self.writer.close()

    def _on(self, event: Event) -> None:
        if isinstance(event, ConnectionTerminated):
            # GOAWAY (a KAPI shutting down, --goaway-chance): h2 takes no frame after it, not
            # even the answers the server still sends, so every request on the connection fails
            # now and the policy asks again on a new one, within the same window.
            self._fail(WireError(f"the server went away ({event.error_code!r})"))
            return
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, DataReceived):
            # Acknowledged even for a stream already given up: the window is the connection's too.
            with contextlib.suppress(H2Error):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if stream is None or stream.answer.done():
            return
        if isinstance(event, ResponseReceived):
            headers: dict[str, str] = {}
            for k, v in event.headers or []:
                name, value = _text(k), _text(v)
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
            stream.status = int(headers.pop(":status"))
            stream.headers = headers
        elif isinstance(event, DataReceived):
            stream.body += event.data or b""
            if len(stream.body) > MAX_RESPONSE_BYTES:
                stream.answer.set_exception(WireError(f"a response over {MAX_RESPONSE_BYTES} bytes"))
        elif isinstance(event, StreamEnded):
            stream.answer.set_result(Response(stream.status, Headers(stream.headers), bytes(stream.body)))
        elif isinstance(event, StreamReset):
            stream.answer.set_exception(WireError(f"the server reset the request ({event.error_code!r})"))

    def _fail(self, error: BaseException) -> None:
        """Every pending request fails with ``error``; the connection takes no new one."""
        self.usable = False
        for stream in self.streams.values():
            if not stream.answer.done():
                failure = WireError(str(error) or type(error).__name__)
                failure.__cause__ = error
                stream.answer.set_exception(failure)

    def close(self) -> None:
        self._fail(WireError("the connection is closed"))
        self._reading.cancel()
        self.writer.close()


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class H1Wire(Wire):
    """One request at a time; a request cancelled or failed in the middle ends the connection
    (HTTP/1.1 cannot abandon one and go on)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._busy = False

    async def send(self, req: Request, authority: str, sent: Callable[[], None]) -> Response:
        if not self.usable or self._busy:
            raise WireError("the connection is closed" if not self.usable else "the connection is busy")
        self._busy = True
        done = False
        try:
            body = req.content or b""
            lines = [f"{req.method} {req.path} HTTP/1.1", f"Host: {authority}"]
            own = ("host", "content-length")
            lines += [f"{k}: {v}" for k, v in req.headers.items() if k.lower() not in own]
            if body or req.method not in ("GET", "HEAD"):
                lines.append(f"Content-Length: {len(body)}")
            self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await self.writer.drain()
            sent()
            response, keep = await self._response(req.method)
            done = keep
            return response
        finally:
            self._busy = False
            if not done:
                self.close()

    async def _line(self) -> str:
        line = await self.reader.readuntil(b"\n")
        if len(line) > MAX_HEADER_LINE:
            raise WireError("a response header line too long")
        return line.decode("latin-1").rstrip("\r\n")

    async def _head(self) -> tuple[str, int, dict[str, str]]:
        status_line = await self._line()
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(status_line)
        headers: dict[str, str] = {}
        while line := await self._line():
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return version, int(rest[:3]), headers

    async def _response(self, method: str) -> tuple[Response, bool]:
        try:
            version, status, headers = await self._head()
            while 100 <= status < 200:  # interim answers (100 Continue): the real one follows
                version, status, headers = await self._head()
            keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
            if method == "HEAD" or status in (204, 304):
                body = b""
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                body = await self._chunked()
            elif "content-length" in headers:
                length = int(headers["content-length"])
                if length > MAX_RESPONSE_BYTES:
                    raise WireError(f"a response over {MAX_RESPONSE_BYTES} bytes")
                body = await self.reader.readexactly(length)
            else:
                body, keep = await self._until_eof(), False
        except (ValueError, asyncio.LimitOverrunError) as e:
            raise WireError(f"not an HTTP/1.1 response: {e}") from e
        except asyncio.IncompleteReadError as e:
            raise WireError("the server closed the connection in a response") from e
        return Response(status, Headers(headers), body), keep

    async def _until_eof(self) -> bytes:
        """A body without a length: all the server sends until it closes the connection."""
        body = bytearray()
        while chunk := await self.reader.read(READ_SIZE):
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise WireError(f"a response over {MAX_RESPONSE_BYTES} bytes")
        return bytes(body)

    async def _chunked(self) -> bytes:
        body = bytearray()
        while True:
            size = int((await self._line()).split(";", 1)[0], 16)
            if size == 0:
                while await self._line():  # trailers
                    pass
                return bytes(body)
            if len(body) + size > MAX_RESPONSE_BYTES:
                raise WireError(f"a response over {MAX_RESPONSE_BYTES} bytes")
            body += await self.reader.readexactly(size)
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.usable = False
        self.writer.close()

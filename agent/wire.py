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

import h11
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
    TrailersReceived,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes, Settings

READ_SIZE = 65536
# What the server has not read of the agent's answers to it (its SETTINGS and PINGs want one
# each) before the connection is given up: a renewal's own request is a few hundred bytes.
MAX_UNSENT_BYTES = 1 << 18
# Frames about the connection, not a response (PING, SETTINGS, WINDOW_UPDATE, PRIORITY...):
# a few a second from a working server.
MAX_CONTROL_FRAMES_PER_S = 200
STREAM_EVENTS = (
    ResponseReceived,
    DataReceived,
    StreamEnded,
    StreamReset,
    TrailersReceived,
    ConnectionTerminated,
)
# A response larger than this is not a Lease: the connection is dropped rather than buffered.
MAX_RESPONSE_BYTES = 1 << 20
# The status line and the headers of one HTTP/1.1 response, together (h11's default is 16 KiB).
MAX_HEAD_BYTES = 16384


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
        # No server push (a renewal wants none), and a response's headers as small as over
        # HTTP/1.1: h2 refuses a header block larger than this, and a pushed stream.
        self.h2.local_settings = Settings(
            client=True,
            initial_values={
                SettingCodes.ENABLE_PUSH: 0,
                SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEAD_BYTES,
                SettingCodes.MAX_CONCURRENT_STREAMS: 100,
            },
        )
        self.h2.initiate_connection()
        self.streams: dict[int, _Stream] = {}
        self._control_since, self._control = asyncio.get_running_loop().time(), 0
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
            if not self.usable:  # the reader failed the connection while this request was made
                raise WireError("the connection is closed")
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
                self._bounded(events)
        except asyncio.CancelledError:
            self._fail(WireError("the connection is closed"))
            raise
        except Exception as e:
            self._fail(e)
            self._flush()  # the GOAWAY h2 queued for a protocol error, if any
            self.writer.close()

    def _bounded(self, events: list[Event]) -> None:
        """A server may ask for answers (PING, SETTINGS) faster than it reads them, or spend the
        agent's loop on frames that carry no response: either ends the connection (h2 queues
        every acknowledgement, and h2 alone bounds neither)."""
        unsent = self.writer.transport.get_write_buffer_size()
        if unsent > MAX_UNSENT_BYTES:
            raise WireError(f"the server reads none of its answers ({unsent} bytes unsent)")
        now = asyncio.get_running_loop().time()
        if now - self._control_since >= 1.0:
            self._control_since, self._control = now, 0
        self._control += sum(not isinstance(e, STREAM_EVENTS) for e in events)
        if self._control > MAX_CONTROL_FRAMES_PER_S:
            raise WireError(f"the server sent over {MAX_CONTROL_FRAMES_PER_S} control frames in a second")

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
    """One request at a time, through h11's state machine (which validates what the server
    sends: the status line, header names and values, the framing of the body); a request
    cancelled or failed in the middle ends the connection (HTTP/1.1 cannot abandon one and go
    on)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        # The status line and every header together: a server that streams header lines
        # without end fails the request at this size instead of growing the agent.
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._busy = False

    async def send(self, req: Request, authority: str, sent: Callable[[], None]) -> Response:
        if not self.usable or self._busy:
            raise WireError("the connection is closed" if not self.usable else "the connection is busy")
        self._busy = True
        done = False
        try:
            self.writer.write(self._request(req, authority))
            await self.writer.drain()
            sent()
            response = await self._response()
            done = self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE
            if done:
                self.h11.start_next_cycle()
            return response
        finally:
            self._busy = False
            if not done:
                self.close()

    def _request(self, req: Request, authority: str) -> bytes:
        body = req.content or b""
        own = ("host", "content-length")
        headers = [("Host", authority), *((k, v) for k, v in req.headers.items() if k.lower() not in own)]
        if body or req.method not in ("GET", "HEAD"):
            headers.append(("Content-Length", str(len(body))))
        try:
            data = self.h11.send(h11.Request(method=req.method, target=req.path, headers=headers)) or b""
            if body:
                data += self.h11.send(h11.Data(data=body)) or b""
            return data + (self.h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError as e:
            raise WireError(f"not a valid HTTP/1.1 request: {e}") from e

    async def _event(self) -> Any:
        """The server's next event; at the end of the stream, h11's ConnectionClosed."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as e:
                raise WireError(f"not an HTTP/1.1 response: {e}") from e
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await self.reader.read(READ_SIZE))

    async def _response(self) -> Response:
        event = await self._event()
        while isinstance(event, h11.InformationalResponse):  # 100 Continue: the real one follows
            event = await self._event()
        if not isinstance(event, h11.Response):
            raise WireError("the server closed the connection in a response")
        status = event.status_code
        headers: dict[str, str] = {}
        for k, v in event.headers:
            name, value = _text(k), _text(v)
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        body = bytearray()
        while not isinstance(event := await self._event(), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                raise WireError("the server closed the connection in a response")
            body += event.data
            if len(body) > MAX_RESPONSE_BYTES:
                raise WireError(f"a response over {MAX_RESPONSE_BYTES} bytes")
        return Response(status, Headers(headers), bytes(body))

    def close(self) -> None:
        self.usable = False
        self.writer.close()

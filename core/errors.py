"""The one error hierarchy of dwd-lease.

What the HTTP underneath raises (the agent's own h11/h2 wire, agent/wire.py, and its
sockets and TLS; aiohttp in the aggregator) is translated into these at its one boundary
(agent/path.py, aggregator/kube/client.py); nothing of theirs leaks past it.

    Exception
     ├── ConfigError            settings or a settings file that cannot be used: every problem at once
     └── KubeError              anything that went wrong talking to an API server (``failure_class``)
          ├── TransportError    no HTTP answer: dns, connect, tls or timeout
          ├── BadResponse       an answer that is not what the API promises
          ├── KubeconfigError   credentials or an endpoint that cannot be used
          ├── CredentialError   a token file missing or empty (core/credentials.py)
          ├── NotLeading        the leader's term ended: no writes
          ├── Throttled         our own rate limit: the request would wait too long, not sent
          └── ApiError          a non-2xx status
               ├── BadRequest        400
               ├── Unauthorized      401
               ├── Forbidden         403
               ├── NotFound          404
               ├── Conflict          409
               ├── Gone              410: re-list
               ├── Invalid           422
               ├── TooManyRequests   429, with Retry-After
               └── ServerError       5xx
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal

TransportKind = Literal["dns", "connect", "tls", "timeout"]


class ConfigError(Exception):
    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class KubeError(Exception):
    """Anything that went wrong talking to an API server."""

    @property
    def failure_class(self) -> str:
        return "other"


class TransportError(KubeError):
    """The request did not get an HTTP answer: which step of the path failed.

    ``sent``: the whole request was written before it failed, so the server may have
    applied it. ``path``: what each connection tried saw, step by step (the agent's).
    """

    def __init__(
        self,
        kind: TransportKind,
        message: str,
        *,
        sent: bool = False,
        path: tuple[dict[str, Any], ...] = (),
    ) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind: TransportKind = kind
        self.sent = sent
        self.path = path

    @property
    def failure_class(self) -> str:
        return self.kind


class BadResponse(KubeError):
    """An HTTP answer that is not what the API promises (not JSON, wrong kind)."""

    @property
    def failure_class(self) -> str:
        return "bad-response"


class KubeconfigError(KubeError):
    """A kubeconfig that cannot be used: missing, unparsable, without a server or credentials."""

    @property
    def failure_class(self) -> str:
        return "kubeconfig"


class NotLeading(KubeError):
    """This replica's leadership ended (or ends before the write could finish)."""

    @property
    def failure_class(self) -> str:
        return "not-leading"


class Throttled(KubeError):
    """A request our own rate limit would hold longer than it may wait: never sent."""

    @property
    def failure_class(self) -> str:
        return "throttled"


class ApiError(KubeError):
    """The API server answered with a non-2xx status."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def failure_class(self) -> str:
        return f"http-{self.status}"


class BadRequest(ApiError):
    """The object could not even be decoded (e.g. a MicroTime without six fractional digits)."""


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class Gone(ApiError):
    """A watch or list resourceVersion is too old: re-list."""


class Invalid(ApiError):
    pass


class TooManyRequests(ApiError):
    """API Priority and Fairness (or a proxy) asks the caller to come back later."""

    def __init__(self, status: int, reason: str, message: str, retry_after_s: float | None) -> None:
        super().__init__(status, reason, message)
        self.retry_after_s = retry_after_s


class ServerError(ApiError):
    pass


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
}


def unreadable(e: Exception) -> str:
    """A file that could not be read or parsed, on one line: the OS's reason, or what is wrong
    with its YAML and where (PyYAML's own message spans four lines with a caret). Duck-typed:
    the agent imports YAML only while it reads a kubeconfig."""
    if isinstance(e, OSError):
        return e.strerror or str(e)
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte {e.object[e.start : e.start + 1]!r} at offset {e.start})"
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"not valid YAML ({where}{problem})"


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the API server only ever sends the delta form."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def api_error(status: int, body: bytes | str, headers: Mapping[str, str] | None = None) -> ApiError:
    """The ApiError for a non-2xx answer, with the reason and message of a metav1.Status body."""
    reason, message = "", ""
    try:
        status_obj = json.loads(body)
        if isinstance(status_obj, dict):
            reason = str(status_obj.get("reason") or "")
            message = str(status_obj.get("message") or "")
    except (ValueError, UnicodeDecodeError):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        message = text.strip()[:200]
    reason = reason or _reason_phrase(status)
    if status == 429:
        retry = parse_retry_after((headers or {}).get("Retry-After"))
        return TooManyRequests(status, reason, message, retry)
    if status >= 500:
        return ServerError(status, reason, message)
    return _BY_STATUS.get(status, ApiError)(status, reason, message)


def raise_for_watch_event(event: Mapping[str, object]) -> None:
    """A watch that cannot be served (e.g. 410 Gone) still answers 200 and reports the
    failure as an ERROR event carrying a Status: raise it as its ApiError."""
    if event.get("type") != "ERROR":
        return
    status = event.get("object")
    status = status if isinstance(status, dict) else {}
    raise api_error(int(status.get("code") or 500), json.dumps(status))


def _reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.replace(" ", "")
    except ValueError:
        return "Unknown"

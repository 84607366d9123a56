from __future__ import annotations

import json

from core.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Gone,
    NotFound,
    ServerError,
    TooManyRequests,
    api_error,
    parse_retry_after,
)


def _status(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "code": code, "reason": reason, "message": message}).encode()


def test_status_body_maps_to_class_with_reason_and_message() -> None:
    e = api_error(404, _status(404, "NotFound", 'leases "n1" not found'))
    assert isinstance(e, NotFound)
    assert (e.status, e.reason, e.message, e.failure_class) == (
        404,
        "NotFound",
        'leases "n1" not found',
        "http-404",
    )
    assert isinstance(api_error(409, _status(409, "Conflict", "x")), Conflict)
    assert isinstance(api_error(410, _status(410, "Expired", "too old")), Gone)
    assert isinstance(api_error(400, b"{}"), BadRequest)


def test_non_json_body_from_a_proxy_is_kept_short() -> None:
    e = api_error(503, b"<html>no healthy upstream</html>" + b"x" * 500)
    assert isinstance(e, ServerError)
    assert e.reason == "ServiceUnavailable"
    assert len(e.message) <= 200
    assert e.failure_class == "http-503"


def test_429_carries_retry_after() -> None:
    e = api_error(429, _status(429, "TooManyRequests", "slow down"), {"Retry-After": "3"})
    assert isinstance(e, TooManyRequests)
    assert e.retry_after_s == 3.0
    bare = api_error(429, b"", {})
    assert isinstance(bare, TooManyRequests) and bare.retry_after_s is None


def test_unknown_status_is_a_plain_api_error() -> None:
    e = api_error(418, b"")
    assert type(e) is ApiError
    assert str(e).startswith("418")


def test_parse_retry_after() -> None:
    assert parse_retry_after("1") == 1.0
    assert parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after(None) is None

"""The agent's own reading of its server URL (agent.path.Origin.from_url), against what
urllib.parse makes of the same URLs: the agent no longer loads urllib.parse."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from agent.origin import Origin

GOOD = [
    "https://api.example.com",
    "https://API.Example.com:6443/prefix/",
    "https://127.0.0.1:443/",
    "https://[::1]:6443",
    "https://[fd00::10]",
    "https://api.example.com:",
]


@pytest.mark.parametrize("url", GOOD)
def test_a_good_url_gives_the_host_and_port_urllib_gives(url: str) -> None:
    parts = urlsplit(url)
    assert Origin.from_url(url) == Origin(str(parts.hostname), parts.port or 443)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://api.example.com", "is not an https URL with a host name"),
        ("api.example.com:443", "is not an https URL with a host name"),
        ("https://", "is not an https URL with a host name"),
        ("https://user@api.example.com", "is not an https URL with a host name"),
        ("https://a:b:c", "is not an https URL with a host name"),
        ("https://[::1]6443", "is not an https URL with a host name"),
        ("https://api.example.com?watch=1", "must not carry a query or fragment"),
        ("https://api.example.com/p#top", "must not carry a query or fragment"),
        ("https://api.example.com:0", "has no valid port ('0')"),
        ("https://api.example.com:65536", "has no valid port ('65536')"),
        ("https://api.example.com:x1", "has no valid port ('x1')"),
    ],
)
def test_a_bad_url_is_refused_saying_why(url: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        Origin.from_url(url)
    assert str(e.value) == why

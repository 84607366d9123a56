"""The aggregator's transport errors, classified from what aiohttp really raises (not from
hand-made exceptions): run on the lowest aiohttp the project allows by ``make lowest``."""

from __future__ import annotations

import socket
from typing import Any

import aiohttp
import pytest

from aggregator.kube.client import classify


class NoAnswer(aiohttp.abc.AbstractResolver):
    """A resolver whose server never answers: no query leaves the machine."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[Any]:
        raise OSError(socket.EAI_AGAIN, f"{host}: temporary failure in name resolution")

    async def close(self) -> None:
        pass


async def _error(url: str, resolver: aiohttp.abc.AbstractResolver | None = None) -> BaseException:
    connector = aiohttp.TCPConnector(resolver=resolver) if resolver else aiohttp.TCPConnector()
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientError) as e:
            await session.get(url)
    return e.value


async def test_a_name_that_does_not_resolve_is_dns() -> None:
    assert classify(await _error("https://kapi.shoot.example:443/readyz", NoAnswer())) == "dns"


async def test_a_refused_connection_is_connect() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        assert classify(await _error(f"https://127.0.0.1:{port}/readyz")) == "connect"

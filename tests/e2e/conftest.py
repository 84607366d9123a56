from __future__ import annotations

import pytest

from testenv.net import netns


@pytest.fixture(autouse=True)
def _needs_network_namespaces() -> None:
    why = netns.available()
    if why:
        # Said plainly, and CI (root) always runs these.
        pytest.skip(f"end-to-end tests need network namespaces: {why}")

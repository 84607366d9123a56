"""testenv's free_port: below the kernel's ephemeral range, each pytest-xdist worker in a share
of its own, and never the same port twice in a process (two workers once picked one port for
two hollow kubelets)."""

from __future__ import annotations

import itertools

import pytest

from testenv.kube import controlplane
from testenv.kube.controlplane import EPHEMERAL_FLOOR, free_port


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controlplane, "_HANDED_OUT", set())


@pytest.mark.usefixtures("fresh")
def test_the_workers_shares_cut_the_range_without_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = EPHEMERAL_FLOOR, controlplane._ephemeral_low()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    shares = []
    for worker in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        shares.append(controlplane._port_share(low, high))
        ports = [free_port() for _ in range(50)]
        assert all(shares[-1][0] <= p < shares[-1][1] for p in ports), (shares[-1], ports)
    assert shares[0][0] == low and shares[-1][1] <= high
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(shares))


@pytest.mark.usefixtures("fresh")
def test_outside_xdist_the_whole_range_and_no_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    low, high = EPHEMERAL_FLOOR, controlplane._ephemeral_low()
    assert controlplane._port_share(low, high) == (low, high)
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    assert all(low <= p < high for p in ports)

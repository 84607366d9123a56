"""testenv's workload binds a pod to a node only once the node's kubelet has reported room for
pods: one bound before was refused for good (OutOfpods, capacity 0)."""

from __future__ import annotations

from typing import Any, cast

from testenv.base.kapi import Client
from testenv.kube.workload import without_room


class Nodes:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def get(self, path: str, **params: str) -> dict[str, Any]:
        assert path == "/api/v1/nodes"
        return {"items": self.items}


def node(name: str, status: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, **({"status": status} if status is not None else {})}


def test_a_node_without_a_reported_room_for_pods_is_waited_for() -> None:
    items = [
        node("created-by-the-test", None),
        node("status-without-allocatable", {"conditions": []}),
        node("room-0", {"allocatable": {"pods": "0"}}),
        node("reported", {"allocatable": {"pods": "110", "cpu": "1"}}),
    ]
    c = cast(Client, Nodes(items))
    names = [n["metadata"]["name"] for n in items]
    assert without_room(c, [*names, "not-registered"]) == [*names[:3], "not-registered"]
    assert without_room(c, ["reported"]) == []

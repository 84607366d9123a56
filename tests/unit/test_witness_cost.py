"""The pure pieces of bench/witness_cost.py: its statistics, its hourly arithmetic, its
reading of kube-apiserver's /metrics, and the objects it writes."""

from __future__ import annotations

import json
import math

import pytest

from aggregator.objects import NodeView
from bench.sampling import CLK_TCK
from bench.stats import quantile
from bench.witness_cost import (
    excess_cpu_s,
    node_object,
    per_hour_polled,
    per_hour_watched,
    scale_to,
    served_from,
)


def test_quantile_interpolates_between_ranks() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(values, 0.5) == 3.0
    assert quantile(values, 0.0) == 1.0
    assert quantile(values, 1.0) == 5.0
    assert quantile(values, 0.99) == pytest.approx(4.96)
    assert math.isnan(quantile([], 0.5))


def test_a_read_every_10_s_is_360_an_hour() -> None:
    cost = per_hour_polled(10.0, mib=0.5, aggregator_cpu_s=0.1, kapi_cpu_s=0.05, calls=118)
    assert cost.requests == 360 * 118
    assert cost.mib == pytest.approx(180)
    assert cost.aggregator_cpu_s == pytest.approx(36)
    assert cost.kapi_cpu_s == pytest.approx(18)


def test_a_watch_costs_its_rates_for_an_hour_and_a_request_per_rewatch() -> None:
    cost = per_hour_watched(500, bytes_per_s=2**20, aggregator_pct=10.0, kapi_pct=5.0)
    assert cost.requests == pytest.approx(3600 / 11)  # Watching's timeouts: 10-12 s, 11 on average
    assert cost.mib == 3600
    assert cost.aggregator_cpu_s == pytest.approx(360)
    assert cost.kapi_cpu_s == pytest.approx(180)


def test_excess_cpu_is_above_the_idle_rate() -> None:
    assert excess_cpu_s(3 * CLK_TCK, span_s=10, idle_rate_per_s=0.25) == pytest.approx(0.5)


def test_served_from_counts_objects_per_list_for_the_resource_alone() -> None:
    before = "\n".join(
        [
            'apiserver_cache_list_returned_objects_total{index="",resource_prefix="/leases"} 100',
            'apiserver_cache_list_returned_objects_total{index="",resource_prefix="/nodes"} 7',
            'apiserver_storage_list_fetched_objects_total{resource="leases.coordination.k8s.io"} 3',
        ]
    )
    after = "\n".join(
        [
            'apiserver_cache_list_returned_objects_total{index="",resource_prefix="/leases"} 10100',
            'apiserver_cache_list_returned_objects_total{index="",resource_prefix="/nodes"} 9007',
            'apiserver_storage_list_fetched_objects_total{resource="leases.coordination.k8s.io"} 5',
        ]
    )
    assert served_from(before, after, "leases", 2) == (
        "objects per LIST from the watch cache 5000, from etcd 1"
    )


def test_the_node_object_is_kubelet_like_and_parses() -> None:
    obj = node_object(4)
    status = obj["status"]
    assert len(status["conditions"]) == 5
    assert len(status["images"]) == 20
    assert {a["type"] for a in status["addresses"]} == {"InternalIP", "InternalDNS", "Hostname"}
    assert len(json.dumps(obj)) > 7000  # a real kubelet's Node is about 8-10 KB of JSON
    view = NodeView.from_object(obj)
    assert (view.name, view.zone, view.true_conditions) == ("node-00004", "zone-b", frozenset({"Ready"}))


def test_a_watch_is_extrapolated_only_when_its_rate_is_off_by_more_than_5_percent() -> None:
    assert scale_to(480, 500) == 1.0
    assert scale_to(250, 500) == 2.0
    assert scale_to(0, 500) == 1.0

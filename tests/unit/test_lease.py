from __future__ import annotations

import collections
from datetime import UTC, datetime, timedelta, timezone

import pytest

from core.lease import (
    LAST_OUTAGE,
    LEASE_LABEL,
    LEASE_PREFIX,
    MAX_NODE_NAME,
    MISSING_MAX_WAIT_S,
    RELEASED,
    LeaseView,
    Outage,
    format_micro_time,
    is_dns_subdomain,
    lease_metadata,
    lease_name,
    missing_wait_s,
    next_renewal_in_s,
    node_of,
    parse_micro_time,
    release_patch,
    renew_patch,
    renewal_phase_s,
)


def test_micro_time_keeps_six_digits_at_microsecond_zero() -> None:
    when = datetime(2026, 11, 30, 12, 0, 0, 0, tzinfo=UTC)
    assert when.isoformat().endswith("12:00:00+00:00")  # what the API server would reject
    assert format_micro_time(when) == "2026-11-30T12:00:00.000000Z"


def test_micro_time_converts_to_utc() -> None:
    when = datetime(2026, 11, 30, 13, 0, 0, 42, tzinfo=timezone(timedelta(hours=1)))
    assert format_micro_time(when) == "2026-11-30T12:00:00.000042Z"


def test_micro_time_refuses_naive() -> None:
    with pytest.raises(ValueError, match="aware"):
        format_micro_time(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    "text", ["2026-01-01T00:00:00.123Z", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00.1234567Z"]
)
def test_parse_micro_time_rejects_what_the_server_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="MicroTime"):
        parse_micro_time(text)


def test_renew_patch_is_minimal_and_never_carries_a_resource_version() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert renew_patch("n1", now) == {
        "spec": {"holderIdentity": "n1", "renewTime": "2026-01-01T00:00:00.000000Z"}
    }


def test_renew_patch_clears_released_and_reports_outage() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    outage = Outage(now - timedelta(seconds=12), 12.5, "connect")
    patch = renew_patch("n1", now, clear_released=True, last_outage=outage)
    annotations = patch["metadata"]["annotations"]
    assert annotations[RELEASED] is None  # null deletes the key in a merge patch
    assert Outage.from_annotation(annotations[LAST_OUTAGE]) == outage
    assert "resourceVersion" not in str(patch)


def test_release_patch() -> None:
    assert release_patch() == {"metadata": {"annotations": {RELEASED: "true"}}}


def test_outage_annotation_rejects_garbage() -> None:
    with pytest.raises(ValueError, match=LAST_OUTAGE):
        Outage.from_annotation('{"start": "yesterday"}')


def test_lease_view() -> None:
    view = LeaseView.from_object(
        {
            "metadata": {
                **lease_metadata("n1"),
                "resourceVersion": "7",
                "annotations": {RELEASED: "true", "dependency-watchdog.gardener.cloud/renew-interval": "2s"},
                "ownerReferences": [{"uid": "u1"}],
            },
            "spec": {
                "holderIdentity": "n1",
                "renewTime": "2026-01-01T00:00:00.000000Z",
                "leaseDurationSeconds": 6,
            },
        }
    )
    assert (view.name, view.released, view.duration_s, view.interval, view.interval_s, view.owner_uids) == (
        "n1",
        True,
        6,
        "2s",
        2.0,
        ("u1",),
    )
    with pytest.raises(ValueError, match=r"metadata\.name"):
        LeaseView.from_object({"metadata": {}})
    # A lease without our prefix is not ours: a kubelet's, a leader election's (kube-system).
    with pytest.raises(ValueError, match="not one of ours"):
        LeaseView.from_object({"metadata": {"name": "kube-controller-manager"}})
    with pytest.raises(ValueError, match="no label"):
        LeaseView.from_object({"metadata": {"name": "dwd-node-lease-n1"}})  # a look-alike
    # The old layout, named like the node, read during the move.
    assert LeaseView.from_object({"metadata": {"name": "n1"}}, legacy=True).name == "n1"


def test_lease_names_carry_the_prefix_and_give_back_the_node() -> None:
    assert lease_name("ip-10-0-0-1.ec2.internal") == "dwd-node-lease-ip-10-0-0-1.ec2.internal"
    assert node_of(lease_name("n1")) == "n1"
    assert node_of("n1") is None and node_of(LEASE_PREFIX) is None
    assert lease_metadata("n1") == {"name": "dwd-node-lease-n1", "labels": {LEASE_LABEL: "true"}}
    longest = "a" * MAX_NODE_NAME
    assert is_dns_subdomain(lease_name(longest))
    with pytest.raises(ValueError, match="characters"):
        lease_name(longest + "b")


def test_renewal_phases_spread_every_interval_evenly() -> None:
    """5000 nodes on a 120 s interval: every 10 s window gets its share (417) within 10 %."""
    nodes = [f"shoot-worker-{i}" for i in range(5000)]
    per_window = collections.Counter(int(renewal_phase_s(n, 120.0) // 10) for n in nodes)
    assert len(per_window) == 12
    assert max(per_window.values()) <= 1.1 * 5000 / 12


def test_the_next_renewal_is_at_the_nodes_phase_half_to_one_and_a_half_intervals_away() -> None:
    phase = renewal_phase_s("n1", 60.0)
    for now in (0.0, 1234.5, phase, phase + 29.9, phase + 30.1):
        delay = next_renewal_in_s("n1", 60.0, now)
        assert 30.0 <= delay < 90.0
        assert abs((now + delay - phase) % 60.0) < 1e-6 or abs((now + delay - phase) % 60.0 - 60.0) < 1e-6


def test_a_fast_interval_is_not_phased() -> None:
    assert next_renewal_in_s("n1", 2.0, 1234.5) == 2.0


def test_the_wait_for_a_missing_lease_stays_bounded_however_long_it_is_missing() -> None:
    # A node whose lease never comes (a wrong namespace) polls for days: no overflow, no drift.
    assert missing_wait_s(10**6, 2.0, 1.0) == MISSING_MAX_WAIT_S
    assert missing_wait_s(0, 2.0, 0.5) == 1.0  # a first miss at the bottom of the spread

"""The first-sight rule against a real API server: managedFields say whether a lease's renewTime
was written after its renew-interval annotation, by different writers and by the same one."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest

from core.lease import RENEW_INTERVAL, format_micro_time, lease_path, leases_path, renewed_after_interval
from testenv.base.kapi import Client
from testenv.kube.controlplane import ControlPlane, ensure_namespace

pytestmark = pytest.mark.integration

NS = "first-sight"


def write(c: Client, manager: str, body: Mapping[str, object], name: str = "n1") -> dict[str, object]:
    return c.request(
        "PATCH",
        lease_path(NS, name),
        body,
        content_type="application/merge-patch+json",
        params={"fieldManager": manager},
    )


def renew(c: Client, name: str = "n1") -> dict[str, object]:
    body = {"spec": {"holderIdentity": name, "renewTime": format_micro_time(datetime.now(UTC))}}
    return write(c, "dwd-lease-agent", body, name)


def test_managed_fields_tell_a_renewal_after_the_interval(control_plane: ControlPlane) -> None:
    with control_plane.admin_client() as c:
        ensure_namespace(c, NS)
        c.request(
            "POST",
            leases_path(NS),
            {"metadata": {"name": "n1", "annotations": {RENEW_INTERVAL: "1m0s"}}, "spec": {}},
            params={"fieldManager": "dwd-lease-aggregator"},
        )
        time.sleep(1.1)
        assert renewed_after_interval(renew(c))
        # The aggregator asks for the fast interval: until the agent renews again, not proven.
        time.sleep(1.1)
        lease = write(c, "dwd-lease-aggregator", {"metadata": {"annotations": {RENEW_INTERVAL: "2s"}}})
        assert not renewed_after_interval(lease)
        time.sleep(1.1)
        assert renewed_after_interval(renew(c))


def test_one_writer_for_both_fields_is_never_after(control_plane: ControlPlane) -> None:
    with control_plane.admin_client() as c:
        ensure_namespace(c, NS)
        c.request(
            "POST", leases_path(NS), {"metadata": {"name": "n2", "annotations": {RENEW_INTERVAL: "2s"}}}
        )
        time.sleep(1.1)
        body = {"spec": {"holderIdentity": "n2", "renewTime": format_micro_time(datetime.now(UTC))}}
        assert not renewed_after_interval(c.merge_patch(lease_path(NS, "n2"), body))

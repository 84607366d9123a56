"""An empty collection as the real API server sends it: a PartialObjectMetadataList without
items comes as ``"items": null`` (a shoot with no nodes yet, watched as metadata only)."""

from __future__ import annotations

import asyncio

import pytest

from aggregator.kube.client import METADATA_LIST, METADATA_ONLY, KubeClient
from aggregator.kube.endpoint import KubeconfigSource
from aggregator.observe.watcher import Informer
from testenv.kube.controlplane import ControlPlane

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("accept", [METADATA_LIST, None])
def test_an_empty_list_is_listed_not_a_bad_answer(control_plane: ControlPlane, accept: str | None) -> None:
    listed: list[list[object]] = []

    async def run() -> None:
        client = KubeClient(KubeconfigSource(str(control_plane.kubeconfig)))
        informer: Informer[object] = Informer(
            client,
            "/apis/coordination.k8s.io/v1/namespaces/no-such-namespace/leases",
            name="leases",
            parse=lambda obj: obj,
            on_list=listed.append,
            on_event=lambda kind, obj: None,
            accept=METADATA_ONLY if accept else None,
            list_accept=accept,
        )
        try:
            await asyncio.wait_for(informer.list_now(), 10)
        finally:
            await client.close()
        assert informer.resource_version

    asyncio.run(run())
    assert listed == [[]]

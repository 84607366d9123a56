"""The node's lease in the first layout (``dwd-node-lease``), renewed beside ours during a move
(docs/install.md, "Moving an installation"), until it answers that it is gone or not ours to
write."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent.client import LeaseClient
from core.errors import Forbidden, KubeError, NotFound
from core.lease import lease_path, release_patch, renew_patch


class LegacyLease:
    def __init__(self, namespace: str, node: str, log: Any) -> None:
        # None: not renewed, or no more (404 or 403 ends it for good).
        self.path: str | None = lease_path(namespace, node) if namespace else None
        self.node = node
        self.log = log
        # The old agent marked it released when it stopped: taken back with the first write.
        self._renewed = False

    async def renew(self, client: LeaseClient, stamp: datetime, window_s: float) -> dict[str, Any] | None:
        """The lease as renewed; None when it is not (any more), or the renewal failed."""
        if self.path is None:
            return None
        patch = renew_patch(self.node, stamp, clear_released=not self._renewed)
        try:
            answer = await client.patch(patch, window_s=window_s, path=self.path)
        except (NotFound, Forbidden) as e:
            self.log.info("legacy_lease_done", lease=self.path, why=e.failure_class)
            self.path = None
            return None
        except KubeError as e:
            self.log.debug("legacy_lease_failed", error=str(e))
            return None
        self._renewed = True
        return answer

    async def release(self, client: LeaseClient, window_s: float) -> None:
        """Mark it released as ours is: unreleased, it would read as a node cut off while the
        successor starts."""
        if self.path is not None:
            await client.patch(release_patch(), window_s=window_s, path=self.path)

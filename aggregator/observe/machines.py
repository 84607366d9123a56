"""The shoot's Machines in the seed, for dependency-watchdog's Machine rule: a node whose Machine
(label ``node=<name>``, in the control-plane namespace) is Failed or Terminating is no candidate.

LISTed, not watched: MCM rewrites a Machine's status on every health check and a Machine
carries its node's conditions, so a watch per shoot would stream far more than the rule needs;
and leaving a node out changes no verdict while nothing is stale. So a LIST every
``DeciderSettings.machines_every_s`` while it matters, every ``machines_idle_s`` otherwise (for
/status), and once more right before a scale-down.

Where dependency-watchdog v1.7.0 differs on purpose: a node without a Machine is a candidate
here (DWD drops it, so a seed without the Machine CRD made it never scale); a seed that does not
serve Machines (404) turns the rule off; any other error keeps the last read's verdicts for
``machines_keep_s`` at most, then none: the rule never leaves every node out, nor blocks a
scale-down for good. Both are on /status.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from aggregator.model.candidates import NODE_LABEL, phases_by_node
from aggregator.model.objects import metadata, section
from core.errors import BadResponse, KubeError, NotFound

if TYPE_CHECKING:
    from aggregator.kube.client import KubeApi

MACHINES = "/apis/machine.sapcloud.io/v1alpha1/namespaces/{namespace}/machines"
PAGE = 500
ABSENT = "off: the seed serves no machines.machine.sapcloud.io"


def _slim(obj: Mapping[str, object]) -> Mapping[str, object]:
    labels = section(metadata(obj), "labels")
    current = section(section(obj, "status"), "currentStatus")
    return {
        "metadata": {"labels": {NODE_LABEL: labels.get(NODE_LABEL)}},
        "status": {"currentStatus": current},
    }


class Machines:
    """The last LIST of a namespace's Machines, and what it is worth now."""

    def __init__(
        self,
        seed: KubeApi,
        namespace: str,
        *,
        keep_s: float,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seed = seed
        self.path = MACHINES.format(namespace=namespace)
        # A target with no control-plane namespace has no Machines to read: the rule is off.
        self.enabled = bool(namespace)
        self.keep_s = keep_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._phases: dict[str, str] = {}
        self.read_at = -math.inf  # the last attempt
        self.ok_at = -math.inf  # the last success
        self.error = ""
        # The last read found no Machine resource in the seed: the rule is off, not failing.
        self.absent = False

    def due(self, every_s: float) -> bool:
        return self.enabled and self.clock() - self.read_at >= every_s

    def phases(self) -> Mapping[str, str]:
        """Node -> its Machine's phase, as far as it may be relied on now."""
        if self.clock() - self.ok_at > self.keep_s:
            return {}
        return self._phases

    async def read(self) -> bool:
        """One LIST; False when it failed (``error`` says why, and nothing is raised: no
        Machine rule is reason to judge nothing)."""
        now = self.read_at = self.clock()
        try:
            # The whole read is bounded, not each page: the tick waits for it.
            async with asyncio.timeout(self.timeout_s):
                items = await self._list()
        except TimeoutError:
            self.error = f"LIST machines: no answer within {self.timeout_s:g}s"
            return False
        except NotFound:
            self._phases, self.ok_at, self.error, self.absent = {}, now, "", True
            return True
        except KubeError as e:
            self.error = f"LIST machines: {e}"
            return False
        self._phases, self.ok_at, self.error, self.absent = phases_by_node(items), now, "", False
        return True

    async def _list(self) -> list[Mapping[str, object]]:
        """Every Machine, in pages: a Machine carries its node's conditions and template, so a
        large shoot's would otherwise arrive and be decoded all at once. Only what the rule
        needs is kept of each page."""
        kept: list[Mapping[str, object]] = []
        params = {"limit": str(PAGE)}
        while True:
            result = await self.seed.request("GET", self.path, params=params, timeout_s=self.timeout_s)
            items = result.get("items")
            if not isinstance(items, list):
                raise BadResponse(f"LIST {self.path}: no items")
            kept.extend(_slim(obj) for obj in items if isinstance(obj, Mapping))
            token = metadata(result).get("continue")
            if not token:
                return kept
            params = {"limit": str(PAGE), "continue": str(token)}

    def rule(self) -> str:
        """What the Machine rule rests on now, for /status."""
        if not self.enabled:
            return "off: the target has no control-plane namespace"
        if self.absent:
            return ABSENT
        if self.error and self.clock() - self.ok_at > self.keep_s:
            return "off until a read succeeds: the last good read is too old"
        if self.error:
            return "on, from the last good read"
        return "on" if self.ok_at > -math.inf else "not read yet"

    def age_s(self) -> float | None:
        """Seconds since the last successful read (None: never)."""
        return None if self.ok_at == -math.inf else self.clock() - self.ok_at

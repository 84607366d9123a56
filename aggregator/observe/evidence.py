"""What a target reads besides its watches: the kubelets' leases (the second witness) and the
seed's Machines. Both are read where a write may follow (the leader), and right before a
scale-down; a failed read is told when it starts and when it ends."""

from __future__ import annotations

from collections.abc import Callable

from structlog.typing import FilteringBoundLogger

from aggregator.kube.client import KubeApi
from aggregator.model.settings import DeciderSettings
from aggregator.observe.kubelets import KubeletLeases
from aggregator.observe.machines import Machines
from core.errors import Forbidden, KubeError, NotFound


class Evidence:
    def __init__(
        self, kubelets: KubeletLeases, machines: Machines, params: DeciderSettings, log: FilteringBoundLogger
    ) -> None:
        self.kubelets = kubelets
        self.machines = machines
        self.params = params
        self.log = log

    @classmethod
    def of(
        cls,
        shoot: KubeApi,
        seed: KubeApi,
        namespace: str,
        params: DeciderSettings,
        *,
        clock: Callable[[], float],
        log: FilteringBoundLogger,
    ) -> Evidence:
        """A shoot's kubelet leases and its Machines in the seed's ``namespace``."""
        keep_s, timeout_s = params.machines_keep_s, params.machines_timeout_s
        machines = Machines(seed, namespace, keep_s=keep_s, timeout_s=timeout_s, clock=clock)
        return cls(KubeletLeases(shoot, clock=clock), machines, params, log)

    async def read_due(self, *, wanted: bool) -> None:
        """The reads whose time has come. The kubelet leases every ``witness_every_s``, healthy
        or not: a renewal is placed on our clock by the two reads around it, and a cut must find
        the bracket there (aggregator/decide/witness.py). The Machines as often while ``wanted`` (a
        candidate is stale, or the shoot is not healthy), otherwise rarely."""
        params = self.params
        if self.kubelets.due(params.witness_every_s):
            await self.read_kubelets()
        if self.machines.due(params.machines_every_s if wanted else params.machines_idle_s):
            await self.read_machines()

    async def read_kubelets(self) -> None:
        try:
            await self.kubelets.read()
        except (Forbidden, NotFound) as e:
            # Not ours to read (the shoot's RBAC not updated yet): no second witness is no reason
            # to refuse protection, the agents' verdict stands.
            self._unreadable(e)
            self.kubelets.refused = True
        except KubeError as e:
            # A read that failed says nothing: a stale node whose kubelet was not yet due stays
            # pending until a read answers, so no scale-down counts on it.
            self._unreadable(e)

    def _unreadable(self, e: KubeError) -> None:
        if str(e) != self.kubelets.error:
            self.log.warning("kubelet_leases_unreadable", error=str(e))
        self.kubelets.error = str(e)

    async def read_machines(self) -> None:
        m = self.machines
        before = (m.error, m.absent)
        await m.read()
        if m.error != before[0]:
            if m.error:
                self.log.warning("machines_unreadable", error=m.error)
            else:
                self.log.info("machines_readable")
        if m.absent and not before[1]:
            self.log.info("machines_absent", rule=m.rule())

"""What the demo samples of a world, as the world goes: the line it prints for a sample, and the
track of samples and marks that the live view and the picture draw. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from testenv.kube.controllers import CA, KCM, MCM


@dataclass(frozen=True)
class Sample:
    """One look at a world: its agents' leases, its controllers, its nodes and endpoints."""

    at: float  # time.monotonic() of the look
    leases_renewed: int  # in the last 4 s
    leases: int
    replicas: Mapping[str, int]  # the seed's Deployments, by name
    kcm_running: int  # KCM processes
    nodes_ready: int
    nodes_seen: int
    nodes_unknown: int
    endpoints: int  # ready endpoints of the Service
    nodes: int  # how many the world started

    @property
    def kcm(self) -> int:
        """KCM's replicas (0 while its Deployment is not seen)."""
        return self.replicas.get(KCM, 0)


def status_line(s: Sample) -> str:
    """The line the demo prints (off a terminal) when it differs from the last one."""
    r = s.replicas
    return (
        f"leases renewed in the last 4s: {s.leases_renewed}/{s.leases}   "
        f"KCM {r.get(KCM)} ({s.kcm_running} running)  "
        f"MCM {r.get(MCM)}  CA {r.get(CA)}   "
        f"nodes Ready {s.nodes_ready}/{s.nodes_seen}, Unknown {s.nodes_unknown}   "
        f"ready endpoints {s.endpoints}/{s.nodes}"
    )


@dataclass
class Track:
    """A world's samples and the moments its act marked (``cut``, ``heal``, ``all_down``: every
    controller at 0), all on time.monotonic()."""

    label: str
    marks: dict[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    def since_cut(self, at: float) -> float | None:
        cut = self.marks.get("cut")
        return None if cut is None else at - cut

"""A synthetic race for the demo's picture and board: two worlds sampled every 0.5 s from 30 s
before the cut to 100 s after, shaped as ``make demo`` measures them (docs/measured.md)."""

from __future__ import annotations

from demo.track import Sample, Track

CUT = 1000.0
NODES = 10


def sample(at: float, *, renewed: int, kcm: int, unknown: int, endpoints: int) -> Sample:
    return Sample(
        at=at,
        leases_renewed=renewed,
        leases=NODES,
        replicas={
            "kube-controller-manager": kcm,
            "machine-controller-manager": min(kcm, 2),
            "cluster-autoscaler": min(kcm, 1),
        },
        kcm_running=kcm,
        nodes_ready=NODES - unknown,
        nodes_seen=NODES,
        nodes_unknown=unknown,
        endpoints=endpoints,
        nodes=NODES,
    )


def unprotected() -> Track:
    """KCM alone: a node Unknown every second from 33 s, its endpoint gone; back at 95 s."""
    track = Track("no protection", {"cut": CUT, "heal": CUT + 50})
    for i in range(-60, 201):
        t = i / 2
        unknown = 0 if t < 33 or t >= 95 else min(NODES, int(t - 33) + 1)
        renewed = NODES if t < 4 or t >= 52 else 0
        track.samples.append(
            sample(CUT + t, renewed=renewed, kcm=3, unknown=unknown, endpoints=NODES - unknown)
        )
    return track


def protected() -> Track:
    """KCM at 0 9 s after the cut, back 10 s after the heal; no node Unknown."""
    track = Track("protection", {"cut": CUT, "all_down": CUT + 9, "heal": CUT + 50})
    for i in range(-60, 201):
        t = i / 2
        renewed = NODES if t < 4 or t >= 52 else 0
        kcm = 0 if 9 <= t < 60 else 3
        track.samples.append(sample(CUT + t, renewed=renewed, kcm=kcm, unknown=0, endpoints=NODES))
    return track

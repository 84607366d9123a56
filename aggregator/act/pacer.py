"""Who renews fast and who slowly, planned for one shoot within DWD_WRITE_BUDGET (budget.py).

Planned where the work starts (a tick, a provisioning pass) and handed to whoever
needs it in that piece of work; a reader that only reports (the status page)
takes the last plan and never re-plans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aggregator.act import budget
from aggregator.act.budget import Pacing
from aggregator.observe.watcher import Observed


@dataclass(frozen=True)
class Plan:
    pacing: Pacing
    # What the plan wanted before members were kept for the hand-over (budget.hand_over).
    wanted_writes_per_s: float


class Pacer:
    def __init__(
        self,
        observed: Observed,
        *,
        fast_interval_s: float,
        write_budget: float,
        clock: Callable[[], float],
        wall: Callable[[], float],
        on_plan: Callable[[Plan], None] = lambda plan: None,
    ) -> None:
        self.observed = observed
        self.fast_interval_s = fast_interval_s
        self.write_budget = write_budget
        self.clock = clock
        # The sample rotates on the wall clock: a restarted or new leader draws the same one.
        self.wall = wall
        self.on_plan = on_plan
        self._last: Pacing | None = None
        self._for: frozenset[tuple[str, str]] = frozenset()
        self._at = float("-inf")

    def plan(self) -> Pacing:
        """The plan for now: re-planned when the nodes changed and every REPLAN_S, as the
        sample rotates; otherwise the last one."""
        zones = {name: node.view.zone for name, node in self.observed.nodes.items()}
        key = frozenset(zones.items())
        now = self.clock()
        if self._last is None or self._for != key or now - self._at >= budget.REPLAN_S:
            wanted = budget.plan(zones, self.fast_interval_s, self.write_budget, zones, now_s=self.wall())
            self._last = budget.hand_over(wanted, self._asked_fast(), self._renewing_fast)
            self._for, self._at = key, now
            self.on_plan(Plan(self._last, wanted.writes_per_s(len(zones))))
        return self._last

    def last(self) -> Pacing:
        """The last plan, for a reader that reports (planned once if there is none yet)."""
        return self._last if self._last is not None else self.plan()

    def _asked_fast(self) -> frozenset[str]:
        """The nodes whose lease asks for the fast interval now: the sample as it stands."""
        return frozenset(
            name
            for name, lease in self.observed.leases.items()
            if lease.view.interval_s is not None and lease.view.interval_s <= self.fast_interval_s
        )

    def _renewing_fast(self, name: str) -> bool:
        lease = self.observed.leases.get(name)
        return (
            lease is not None
            and lease.view.interval_s is not None
            and lease.view.interval_s <= self.fast_interval_s
            and lease.seen_renewed_mono > lease.paced_since_mono
        )

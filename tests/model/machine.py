"""The stateful model: what the aggregator's world can do, as rules, and its guarantees, as
invariants, explored by hypothesis (docs/decision.md, "The model").

Rules: the path cut and healed (every node, a quorum, a minority, one), agents failing on a
working path (403, killed) and back, kubelets stopping and starting or renewing late (loaded, or
a renewal failed and retried), nodes added and deleted,
a replica restarted (cleanly or killed) or cut off from the seed, writes held by a slow seed
and landing later, seed faults (409, 429, 500, time-outs), a seed watch that falls behind,
dependency-watchdog's scale-down and scale-up, an operator's scale and ``ignore-scaling``, our
annotation or label removed, the Cluster hibernated, migrated and back, the shoot's token
revoked, its API server down, node clocks stepped; the agent DaemonSet rolled (any
maxUnavailable, successors quick or slower than the roll allowance, releasing the old layout's
lease too or ours only), a move from the first layout, machines breaking, the kubelets' leases
refused; the settings drawn from their allowed ranges.

Invariants, after every step (``World.violations``) and at the quiet end (``teardown``):
  I1  no scale-down while more than (1 - failure fraction) of the candidates' kubelets renew,
      counted over the nodes eligible before any roll (without the second witness, of their
      agents reaching KAPI, a rolling one counting as reaching);
  I2  once path, credentials and leadership are healthy, every controller is back within the
      recovery period, the blind limit, a leader's lease duration and MCM's scale-up delay, and
      nothing is at 0 at the quiet end;
  I3  a restored count is the recorded one or what another writer set meanwhile;
  I4  dry-run writes nothing to the seed but its election Leases;
  I5  nothing is raised on a shoot whose owner (gardenlet) wants it at 0.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from aggregator.model.records import IGNORE_SCALING, MELTDOWN, RECORD, REPLICAS, Record
from testenv.kube.controllers import CONTROLLERS
from tests.model.world import CONFIGS, SHOOT_STATES, World, deployment_path

DEPENDENTS = sorted(CONTROLLERS)
# MCM comes back this long after KCM (dependency-watchdog's order, aggregator/model/dependents.py).
SCALE_UP_DELAYS_S = 30.0
# A watch that gets no answer is given up on after this (docs/decision.md, "One tick").
BLIND_NOTICED_S = 27.0
# Sequences and steps run, per machine (the soak reports them).
COUNTS: Counter[tuple[str, str]] = Counter()


@st.composite
def settings(draw: Any) -> dict[str, Any]:
    """The settings, drawn from their allowed ranges (aggregator/model/settings.py)."""
    interval = draw(st.sampled_from([0.5, 1.0, 2.0]))
    lease = draw(st.sampled_from([2 * interval, 4.0, 8.0, 12.0]).filter(lambda x: x >= 2 * interval))
    failure = draw(st.sampled_from([0.5, 0.6, 0.8]))
    return {
        "fast_interval_s": interval,
        "lease_duration_s": lease,
        "failure_fraction": failure,
        "recovery_fraction": draw(st.sampled_from([0.2, 0.4]).filter(lambda x: x <= failure)),
        "confirm_period_s": draw(st.sampled_from([0.0, 2.0, 4.0])),
        "recovery_period_s": draw(st.sampled_from([0.0, 5.0, 10.0])),
        "min_candidates": draw(st.sampled_from([1, 2, 3])),
        "node_grace_s": draw(st.sampled_from([0.0, 20.0])),
        "blind_limit_s": draw(st.sampled_from([max(lease, 10.0), 30.0, 120.0])),
        "roll_allowance_s": draw(st.sampled_from([lease, 15.0, 30.0]).filter(lambda x: x >= lease)),
    }


SOME = st.sampled_from(["all", "quorum", "sub-quorum", "minority", "one"])
# Each event lets time pass after it (none, a few ticks, a lease duration and a confirm period,
# a kubelet's interval and more): an event undone before it could matter finds nothing.
THEN = st.sampled_from([0, 3, 13, 30])


def event(**strategies: Any) -> Callable[[Callable[..., None]], Any]:
    """A rule that does something to the world, then lets ``then`` seconds pass; drawn only
    where the machine's ``focus`` names it (every rule where it has none)."""

    def wrap(fn: Callable[..., None]) -> Any:
        @functools.wraps(fn)
        def run(self: Model, then: int, **kw: Any) -> None:
            fn(self, **kw)
            if then:
                self.run(self.world.run(then))

        in_focus = precondition(lambda self: self.focus is None or fn.__name__ in self.focus)
        # hypothesis's overload for a rule with no target (``**strategies`` could name one).
        as_rule: Callable[[Callable[..., None]], Callable[..., None]] = rule(then=THEN, **strategies)
        return in_focus(as_rule(run))

    return wrap


class Model(RuleBasedStateMachine):
    dry_run = False
    # The events drawn (None: all of them).
    focus: frozenset[str] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.w: World | None = None

    def run(self, work: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(work)

    @property
    def world(self) -> World:
        assert self.w is not None
        return self.w

    @initialize(drawn=settings(), nodes=st.integers(2, 8), seed=st.integers(0, 2**16))
    def start(self, drawn: dict[str, Any], nodes: int, seed: int) -> None:
        self.w = World(random.Random(seed), drawn | {"dry_run": self.dry_run}, nodes)
        self.run(self.world.run(25))  # a leader, both replicas judging

    def pick(self, which: str, offset: int = 0) -> list[str]:
        names = sorted(self.world.nodes)
        f = self.world.p.failure_fraction
        k = {
            "all": len(names),
            "quorum": math.ceil(f * len(names)),
            # The largest cut below the quorum (a zone): KCM should fail over, nothing lowered.
            "sub-quorum": max(0, math.ceil(f * len(names) - 1e-9) - 1),
            "minority": max(0, math.floor((1 - f) * len(names) - 1e-9)),
            "one": 1,
        }[which]
        rotated = names[offset % max(1, len(names)) :] + names[: offset % max(1, len(names))]
        return rotated[:k]

    # -- time
    @rule(seconds=st.sampled_from([1, 2, 3, 5, 8, 13, 21, 40]))
    def wait(self, seconds: int) -> None:
        self.run(self.world.run(seconds))

    # -- the path, the agents, the kubelets
    @event(which=SOME, offset=st.integers(0, 7))
    def cut(self, which: str, offset: int) -> None:
        for n in self.pick(which, offset):
            self.world.nodes[n].path = False

    @event()
    def heal(self) -> None:
        for node in self.world.nodes.values():
            node.path = True

    @event(which=SOME, offset=st.integers(0, 7), how=st.sampled_from(["403", "killed"]))
    def agents_fail(self, which: str, offset: int, how: str) -> None:
        for n in self.pick(which, offset):
            self.world.nodes[n].agent = how

    @event()
    def agents_recover(self) -> None:
        for node in self.world.nodes.values():
            node.agent = "ok"

    @event(which=SOME, offset=st.integers(0, 7))
    def kubelets_stop(self, which: str, offset: int) -> None:
        for n in self.pick(which, offset):
            self.world.nodes[n].kubelet = False

    @event()
    def kubelets_start(self) -> None:
        for node in self.world.nodes.values():
            node.kubelet = True

    @event(
        which=SOME,
        offset=st.integers(0, 7),
        late_s=st.sampled_from([0.0, 0.25, 0.5]),
        fails=st.integers(0, 2),
    )
    def kubelets_late(self, which: str, offset: int, late_s: float, fails: int) -> None:
        """Kubelets renewing late within their 40 s lease: loaded (each write lands up to half a
        second after its stamp, still renewing to I1), or a renewal failing and retried at the
        next interval (not renewing, to I1, for that cycle). A write later than half the
        witness's slack is silent to it for a moment each renewal (docs/decision.md, "The second
        witness": not covered; the soak found it with writes 1.5 s late)."""
        for n in self.pick(which, offset):
            self.world.nodes[n].kubelet_late_s = late_s
            self.world.nodes[n].kubelet_fails += fails

    @event(which=SOME, offset=st.integers(0, 7))
    def machines_break(self, which: str, offset: int) -> None:
        """Machines fail (NotReady, not yet replaced by MCM): agent and kubelet silent at once."""
        for n in self.pick(which, offset):
            self.world.nodes[n].agent, self.world.nodes[n].kubelet = "killed", False

    # -- the agents' DaemonSet
    @event(
        which=st.sampled_from(["all", "all", "quorum", "minority"]),
        offset=st.integers(0, 7),
        max_unavailable=st.sampled_from([0.1, 0.25, 0.5, 1.0]),
        slow=st.sampled_from(["quick", "lease", "allowance"]),
        release_both=st.booleans(),
        broken=st.sampled_from(["none", "one", "minority"]),
    )
    def roll(
        self,
        *,
        which: str,
        offset: int,
        max_unavailable: float,
        slow: str,
        release_both: bool,
        broken: str = "none",
    ) -> None:
        """The agents rolled at ``max_unavailable``, each successor starting within half a lease
        duration, after two, or past the roll allowance (an image pulled over a slow registry);
        the agents rolled away release the old layout's lease too, or (0.2.0's) only ours. A fleet
        rolls with some machines broken a while (``broken``, NotReady and not replaced yet: for
        long enough that the kubelets' leases say so)."""
        w, p = self.world, self.world.p
        if broken != "none":
            self.machines_break(then=30, which=broken, offset=offset + len(w.nodes) // 2)
        names = self.pick(which, offset)
        batch = max(1, math.ceil(max_unavailable * len(w.nodes)))
        delay = {
            "quick": p.lease_duration_s / 2,
            "lease": 2 * p.lease_duration_s,
            "allowance": p.roll_allowance_s + 10,
        }
        w.roll(names, batch, delay[slow], release_both=release_both)

    @event(on=st.booleans())
    def witness_refused(self, on: bool) -> None:
        """The shoot refuses the kubelets' leases (403): no second witness, the agents' verdict
        stands."""
        self.world.witness_refused = on

    @event(on=st.booleans())
    def move(self, on: bool) -> None:
        """A move from the first layout (dwd-node-lease) begins or ends."""
        self.world.move(on)

    @event(
        which=SOME,
        offset=st.integers(0, 7),
        dt=st.sampled_from([-0.5, -0.25, 0.25, 0.5, -30.0, 30.0, -300.0, 3600.0, -3600.0, -86400.0]),
    )
    def clock_step(self, which: str, offset: int, dt: float) -> None:
        """NTP (or a VM restored from a snapshot) steps nodes' clocks, agent and kubelet share
        each: small corrections, and steps of 30 s to a day either way."""
        for n in self.pick(which, offset):
            self.world.nodes[n].skew_s += dt

    @precondition(lambda self: self.w is not None and len(self.w.nodes) < 10)
    @event()
    def add_node(self) -> None:
        self.world.add_node()

    @precondition(lambda self: self.w is not None and len(self.w.nodes) > 1)
    @event(offset=st.integers(0, 7))
    def delete_node(self, offset: int) -> None:
        for n in self.pick("one", offset):
            self.world.delete_node(n)

    # -- the aggregator's replicas and their seed
    @event(replica=st.integers(0, 1), clean=st.booleans(), config=st.sampled_from(sorted(CONFIGS)))
    def restart(self, replica: int, clean: bool, config: str = "same") -> None:
        """Restarted, or rolled out with other settings: a dependent dropped (or back), another
        failure fraction, a shorter lease duration."""
        self.run(self.world.restart(replica, clean=clean, config=config)())

    @event(replica=st.integers(0, 1))
    def crash(self, replica: int) -> None:
        """Killed, and not back until it is restarted."""
        self.world.down[replica] = True

    @event(replica=st.integers(0, 1), cut=st.booleans())
    def seed_cut(self, replica: int, cut: bool) -> None:
        """The replica cannot reach the seed (its term ends; another takes over)."""
        self.world.replicas[replica].seed.cut = cut

    @event(replica=st.integers(0, 1), hold=st.booleans())
    def seed_holds_writes(self, replica: int, hold: bool) -> None:
        self.world.replicas[replica].seed.hold = hold

    @rule(how_many=st.integers(1, 4))
    def land(self, how_many: int) -> None:
        self.world.land(how_many)

    @event(
        replica=st.integers(0, 1),
        faults=st.lists(st.sampled_from(["409", "429", "500", "held"]), min_size=1, max_size=4),
    )
    def seed_faults(self, replica: int, faults: list[str]) -> None:
        self.world.replicas[replica].seed.faults = faults

    @event(replica=st.integers(0, 1), behind=st.booleans())
    def seed_watch_behind(self, replica: int, behind: bool) -> None:
        self.world.replicas[replica].watch_behind = behind

    @event(replica=st.integers(0, 1), lag=st.sampled_from([0.0, 1.8]))
    def overloaded(self, replica: int, lag: float) -> None:
        """A seed-wide burst: the replica's event loop runs late and its probes time out."""
        self.world.replicas[replica].shoot.overloaded = lag

    # -- the shoot's API server and credentials
    @event(state=st.sampled_from(["up", "down", "starting"]))
    def kapi(self, state: str) -> None:
        """Starting: it serves LISTs and watches, its /readyz is not 200 yet, and the load
        balancer admits no node (a KAPI restarting under load)."""
        self.world.kapi_up, self.world.kapi_ready = state != "down", state == "up"

    @event(ok=st.booleans())
    def token(self, ok: bool) -> None:
        self.world.token_ok = ok

    # -- the seed's other writers
    @event(name=st.sampled_from(DEPENDENTS))
    def dwd_scale_down(self, name: str) -> None:
        w = self.world
        current = w.replicas_now()[name]
        if current > 0:
            w.write_seed(name, replicas=0, annotations={REPLICAS: str(current), MELTDOWN: ""})
            w.dwd_lowered.add(name)

    @event(name=st.sampled_from(DEPENDENTS))
    def dwd_scale_up(self, name: str) -> None:
        """Any dependent at 0 goes to its ``replicas`` annotation (1 without), whoever lowered it."""
        w = self.world
        if not w.served():
            return
        if w.replicas_now()[name] == 0:
            obj = w.seed.objects[deployment_path(name)]
            to = int((obj["metadata"].get("annotations") or {}).get(REPLICAS, "1"))
            w.write_seed(name, replicas=to)
            w.wanted[name] = to
        w.write_seed(name, annotations={MELTDOWN: None})
        w.dwd_lowered.discard(name)

    @event(name=st.sampled_from(DEPENDENTS), replicas=st.sampled_from([1, 2, 5]))
    def operator_scale(self, name: str, replicas: int) -> None:
        if self.world.served():
            self.world.write_seed(name, replicas=replicas)
            self.world.wanted[name] = replicas

    @event(name=st.sampled_from(DEPENDENTS), on=st.booleans())
    def ignore_scaling(self, name: str, on: bool) -> None:
        self.world.write_seed(name, annotations={IGNORE_SCALING: "true" if on else None})

    @event(name=st.sampled_from(DEPENDENTS), what=st.sampled_from(["annotation", "annotations", "label"]))
    def lose_record(self, name: str, what: str) -> None:
        """Another writer removes our annotation, every annotation (a re-apply of the manifest:
        dependency-watchdog's count beside ours goes too), or our label: one of our two marks.
        One that strips both has taken the dependent over, as dependency-watchdog's own marks
        are its (docs/decision.md): that is not a record lost."""
        meta = self.world.seed.objects[deployment_path(name)]["metadata"]
        annotated, labeled = RECORD in (meta.get("annotations") or {}), RECORD in (meta.get("labels") or {})
        if what == "annotation" and labeled:
            self.world.write_seed(name, annotations={RECORD: None})
        elif what == "annotations" and labeled:
            self.world.write_seed(name, annotations=dict.fromkeys(meta.get("annotations") or {}))
        elif what == "label" and annotated:
            self.world.write_seed(name, labels={RECORD: None})

    # -- gardenlet
    @event(to=st.sampled_from(sorted(SHOOT_STATES)))
    def gardenlet(self, to: str) -> None:
        """gardenlet takes the shoot to another state of its life, with the Cluster's fields as
        it writes them. Where every target stops (hibernating, migrating, deleting, no workers),
        it decides the controllers: it takes them to 0. Every reconcile that succeeds (woken up,
        created again, restored, or any other) scales up what carries no
        ``meltdown-protection-active``."""
        w = self.world
        w.state = to
        if w.owner() and not w.taken:
            self.owner_takes_over()
        elif w.served() and (w.taken or to == "reconciled"):
            # Every reconcile that succeeds deploys the controllers at their replicas, all but
            # those carrying meltdown-protection-active (a restore, a wake-up, a creation end so).
            self.owner_gives_back()
        for r in w.replicas:
            r.orphans.wake.set()

    def owner_takes_over(self) -> None:
        w = self.world
        w.taken = True
        for name in DEPENDENTS:
            # A count someone set on a dependent we hold down is seen by us only at our next
            # look; gardenlet's zero erases it before that, whether we had lowered it again or
            # it still runs at their count. What can come back is our record's: the soak found
            # an operator's 5 on a controller held at 0 zeroed by a migration, our record's 2
            # restored after it (gardenlet leaves what carries meltdown-protection-active).
            if (recorded := self.recorded(name)) is not None:
                w.wanted[name] = recorded
            w.write_seed(name, replicas=0)

    def recorded(self, name: str) -> int | None:
        """The count our marks on ``name`` hold (annotation, else label), None without one."""
        meta = self.world.seed.objects[deployment_path(name)]["metadata"]
        if (text := (meta.get("annotations") or {}).get(RECORD)) is not None:
            return Record.parse(text).replicas
        label = str((meta.get("labels") or {}).get(RECORD, ""))
        return int(label) if label.isdigit() else None

    @event(back=st.booleans())
    def target_removed(self, back: bool) -> None:
        """The target leaves the targets file (or its Cluster object goes), and comes back: nobody
        decides its controllers meanwhile, so what we hold down is restored by the sweep."""
        w = self.world
        w.removed = not back
        for r in w.replicas:
            r.orphans.wake.set()

    def owner_gives_back(self) -> None:
        """Woken up, back from a failed migration, created again: gardenlet scales up what is not
        marked, and the shoot is reconciled."""
        w = self.world
        w.state, w.taken = "reconciled", False
        for name in DEPENDENTS:
            if MELTDOWN not in (w.seed.objects[deployment_path(name)]["metadata"].get("annotations") or {}):
                w.write_seed(name, replicas=w.wanted[name])

    # -- the guarantees
    @invariant()
    def nothing_violated(self) -> None:
        COUNTS[type(self).__name__, "steps"] += 1
        if self.w is not None:
            assert not self.w.violations, self.w.violations

    def teardown(self) -> None:
        COUNTS[type(self).__name__, "sequences"] += 1
        try:
            if self.w is not None:
                self.run(self.quiet_end())
        finally:
            self.loop.close()

    async def quiet_end(self) -> None:
        """I2, I3: everything healthy and handed back; every controller back at what its owners
        want, without our marks, in time, and still there at the end."""
        w = self.world
        w.kapi_up, w.kapi_ready, w.token_ok, w.witness_refused = True, True, True, False
        for node in w.nodes.values():
            node.path, node.agent, node.kubelet = True, "ok", True
        for i, r in enumerate(w.replicas):
            r.seed.cut, r.seed.hold, r.seed.faults, r.watch_behind = False, False, [], False
            r.shoot.overloaded = 0.0
            if w.down[i]:
                await w.restart(i, clean=False)()
        for name in DEPENDENTS:
            w.write_seed(name, annotations={IGNORE_SCALING: None})
        self.target_removed(then=0, back=True)
        if w.state != "reconciled" or w.taken:
            self.gardenlet(then=0, to="reconciled")
        for name in sorted(w.dwd_lowered):
            self.dwd_scale_up(then=0, name=name)
        w.land()
        await self.blind_end()
        start, back = w.clock(), None
        p = w.p
        bound = p.recovery_period_s + p.blind_limit_s + 15.0 + p.lease_duration_s + SCALE_UP_DELAYS_S + 10.0
        while w.clock() - start < bound + 20:
            await w.step()
            w.land()
            home = w.replicas_now() == w.wanted and not any(
                w.marks(n) & {RECORD, MELTDOWN} for n in DEPENDENTS
            )
            if home and back is None:
                back = w.clock() - start
            elif not home:
                back = None
        assert not w.violations, w.violations
        assert back is not None, (
            f"I2: not back at the quiet end: {w.replicas_now()} want {w.wanted}, "
            f"marks {[w.marks(n) for n in DEPENDENTS]}"
        )
        assert back <= bound, f"I2: back only {back:.0f}s after the quiet began (bound {bound:.0f}s)"
        await self.protection_still_works()

    def held_by_us(self) -> list[str]:
        w, out = self.world, []
        for name in DEPENDENTS:
            meta = w.seed.objects[deployment_path(name)]["metadata"]
            ours = RECORD in (meta.get("annotations") or {}) or RECORD in (meta.get("labels") or {})
            if ours and w.replicas_now()[name] == 0:
                out.append(name)
        return out

    async def blind_end(self) -> None:
        """I2, blind: the shoot refuses the aggregator for good (a revoked token). Whatever it
        holds down comes back within the blind limit, seen or not: noticed (a watch's longest
        silence), the limit, MCM's scale-up delay."""
        w, p = self.world, self.world.p
        w.token_ok = False
        bound = BLIND_NOTICED_S + p.blind_limit_s + SCALE_UP_DELAYS_S + 15.0
        start = w.clock()
        while w.clock() - start < bound and self.held_by_us():
            await w.step()
            w.land()
        assert not w.violations, w.violations
        assert not self.held_by_us(), f"I2: {self.held_by_us()} held at 0 while blind for {bound:.0f}s"
        w.token_ok = True

    async def protection_still_works(self) -> None:
        """I6: whatever happened before, a cut of every node is still scaled down, in the time a
        cut takes from a healthy start: the agents' lease duration, the confirm period, the
        kubelets' next renewals, a few ticks."""
        w, p = self.world, self.world.p
        if len(w.nodes) < p.min_candidates or w.settings.scaling.dry_run:
            return
        for node in w.nodes.values():
            node.path = False
        start = w.clock()
        bound = p.lease_duration_s + p.confirm_period_s + p.witness_margin_s + 10.4 + p.witness_slack_s
        bound += 4 * p.tick_s + 5.0
        # What every replica has configured (a rollout may have dropped a dependent).
        protected = set.intersection(*({d.name for d in r.dependents} for r in w.replicas))

        def up() -> dict[str, int]:
            return {n: count for n, count in w.replicas_now().items() if n in protected and count}

        while w.clock() - start < bound and up():
            await w.step()
        assert not w.violations, w.violations
        assert not up(), f"I6: a cut not scaled down within {bound:.0f}s: {w.replicas_now()}"


class DryRunModel(Model):
    dry_run = True


class RollModel(Model):
    """The fleet changing under the verdict and nothing else: rolls (at every pace, during a
    move, with or without the second witness) among cuts, broken machines and failing agents
    and kubelets, so that each sequence is dense with their interleavings."""

    focus = frozenset(
        {
            "cut",
            "heal",
            "agents_fail",
            "agents_recover",
            "kubelets_stop",
            "kubelets_start",
            "kubelets_late",
            "machines_break",
            "roll",
            "move",
            "witness_refused",
            "add_node",
            "delete_node",
        }
    )

"""Which shoots get a target, against the real dependency-watchdog v1.7.0: every lifecycle state
of a Cluster's Shoot (testenv.gardener.dependency_watchdog.shoot_states, 496), once as a Cluster created in
that state (``new-<i>``) and once as a running one moved to it (``run-<i>``: created reconciled,
its prober started, then replaced), in one seed. Whether DWD has a prober for each, against the
aggregator's rule (aggregator/model/lifecycle.py) and against the real GardenerSource watching the same
seed through the same two phases.

The probers DWD starts never probe (testenv.gardener.dependency_watchdog.IDLE): what is compared is its
cluster controller's decision, read from its log."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from structlog.testing import capture_logs

from aggregator.kube.client import KubeClient
from aggregator.kube.endpoint import KubeconfigSource
from aggregator.model.lifecycle import ClusterView
from aggregator.observe.sources import CLUSTERS, GardenerSource
from testenv.base.kapi import Client
from testenv.base.wait import wait_for
from testenv.gardener import dependency_watchdog
from testenv.gardener.dependency_watchdog import DependencyWatchdog, ShootState, find, shoot_states
from testenv.gardener.seed_objects import LAST_OPERATION_STATES, LAST_OPERATION_TYPES, cluster
from testenv.kube.controlplane import ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.builds(dependency_watchdog.NAME)]

Phase = Literal["new", "running"]
# (state, phase) -> why the aggregator decides otherwise than DWD, on purpose. None for these
# fields: the one deliberate difference (a Cluster's own deletionTimestamp) is not varied here.
DELIBERATE: dict[tuple[ShootState, Phase], str] = {}
# Created after every other write: once a watcher has seen it, it has seen them all.
SENTINEL = "zz-last"
WRITERS = 16
WAIT_S = 60.0


@pytest.fixture(scope="module")
def seed() -> Iterator[ControlPlane]:
    """A seed of its own: a thousand Clusters in a shared one would reach other tests' sources."""
    try:
        find()
    except FileNotFoundError as e:
        pytest.fail(str(e))  # never a silent skip
    with ControlPlane().running() as cp:
        yield cp


class Writer:
    """Creates and replaces Clusters from a pool of threads, a client each."""

    def __init__(self, seed: ControlPlane) -> None:
        self.seed = seed
        self.local = threading.local()
        self.clients: list[Client] = []
        self.versions: dict[str, str] = {}

    def _client(self) -> Client:
        if not hasattr(self.local, "client"):
            self.local.client = self.seed.admin_client()
            self.clients.append(self.local.client)
        client: Client = self.local.client
        return client

    def _create(self, obj: dict[str, Any]) -> None:
        created = self._client().create(CLUSTERS, obj)
        self.versions[obj["metadata"]["name"]] = created["metadata"]["resourceVersion"]

    def _replace(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self.versions[name]}}
        self._client().put(f"{CLUSTERS}/{name}", body)

    def write(self, creates: Sequence[dict[str, Any]], replaces: Sequence[dict[str, Any]] = ()) -> None:
        jobs = [(self._create, o) for o in creates] + [(self._replace, o) for o in replaces]
        with ThreadPoolExecutor(WRITERS) as pool:
            for done in [pool.submit(call, obj) for call, obj in jobs]:
                done.result()

    def close(self) -> None:
        for c in self.clients:
            c.close()


@contextlib.asynccontextmanager
async def watching(seed: ControlPlane) -> AsyncIterator[GardenerSource]:
    client = KubeClient(KubeconfigSource(str(seed.kubeconfig)))
    source = GardenerSource(client, "access")
    task = asyncio.create_task(source.run(), name="gardener-source")
    try:
        yield source
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


async def serving(source: GardenerSource, names: set[str]) -> None:
    """Until the source's answer names every one of ``names``: from then on they run."""
    deadline = time.monotonic() + WAIT_S
    while not names <= set(await source.desired()):
        assert time.monotonic() < deadline, f"the source serves {len(names - set(source.serving))} too few"
        await asyncio.sleep(0.1)


async def seen(source: GardenerSource, name: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while name not in source.clusters:
        assert time.monotonic() < deadline, f"the source has not seen {name}"
        await asyncio.sleep(0.1)


def dwd_settled(dwd: DependencyWatchdog) -> None:
    """Until DWD has reconciled the sentinel (and so has queued every earlier event), nothing is
    queued or running, and its reconcile count holds still."""
    wait_for(lambda: SENTINEL in dwd.probers(), WAIT_S, f"DWD's prober for {SENTINEL}", every_s=0.2)
    last = [-1]

    def still() -> bool:
        count, before = dwd.reconciles(), last[0]
        last[0] = count
        return dwd.idle() and count == before

    wait_for(still, WAIT_S, "DWD idle", every_s=0.3)


@dataclass(frozen=True)
class Row:
    """One state: whether each side has a prober (a target) for its new and its running Cluster."""

    state: ShootState
    view: ClusterView
    dwd: tuple[bool, bool]
    source: tuple[bool, bool]

    @property
    def rule(self) -> tuple[bool, bool]:
        return (self.view.lifecycle.serves(running=False), self.view.lifecycle.serves(running=True))

    def differs(self) -> list[Phase]:
        phases: tuple[Phase, Phase] = ("new", "running")
        return [p for i, p in enumerate(phases) if len({self.dwd[i], self.rule[i], self.source[i]}) > 1]

    def verdict(self) -> str:
        """What all agree on, with the rule's reason where there is no prober."""
        new, running = (self.view.lifecycle.reason(r) or "prober" for r in (False, True))
        return f"new: {new:<16} running: {running:<12}"


def label(s: ShootState) -> str:
    op = "/".join(s.last_operation) if s.last_operation else "-"
    return (
        f"deleting={s.deleting!s:<5} hibernation={s.hibernation!s:<5} hibernated={s.hibernated!s:<5} "
        f"workers={s.workers} lastOperation={op}"
    )


def yes(flags: tuple[bool, bool]) -> str:
    return "/".join("yes" if f else "no" for f in flags)


def operations(ops: set[tuple[str, str] | None]) -> str:
    """Last operations, a type in every state as ``Type/*``."""
    out = ["-"] if None in ops else []
    for kind in LAST_OPERATION_TYPES:
        states = [state for state in LAST_OPERATION_STATES if (kind, state) in ops]
        if states:
            out.append(
                f"{kind}/*" if len(states) == len(LAST_OPERATION_STATES) else f"{kind}/{','.join(states)}"
            )
    return " ".join(out)


def which(states: list[ShootState], every: list[ShootState]) -> str:
    """The states as the values of each field they share; a field they take every value of
    is left out."""
    out = []
    for name in ("deleting", "hibernation", "hibernated", "workers", "last_operation"):
        values = {getattr(s, name) for s in states}
        if values != {getattr(s, name) for s in every}:
            shown = operations(values) if name == "last_operation" else "|".join(map(str, sorted(values)))
            out.append(f"{name}={shown}")
    return " ".join(out)


def print_table(rows: list[Row]) -> None:
    every = [r.state for r in rows]
    agreeing: dict[str, list[ShootState]] = {}
    for r in rows:
        if not r.differs():
            agreeing.setdefault(r.verdict(), []).append(r.state)
    print(f"\nlifecycle: {len(rows)} states, each a new Cluster and a running one (prober or why none)")
    print(f"{sum(map(len, agreeing.values()))} states where DWD, the rule and the source agree:")
    for verdict, states in sorted(agreeing.items(), key=lambda vs: -len(vs[1])):
        print(f"  {len(states):4d}  {verdict} {which(states, every)}")
    for r in rows:
        if r.differs():
            why = "; ".join(DELIBERATE.get((r.state, p), "NOT DELIBERATE") for p in r.differs())
            print(
                f"  DIFFERS {label(r.state)}: new/running DWD {yes(r.dwd)} rule {yes(r.rule)} "
                f"source {yes(r.source)} ({why})"
            )


def undeliberate(rows: list[Row]) -> list[str]:
    """The differences DELIBERATE does not name, and the ones it names that are not there. A
    deliberate one is DWD's alone: the rule and the source always agree."""
    out = []
    for r in rows:
        for i, p in enumerate(("new", "running")):
            if p in r.differs() and ((r.state, p) not in DELIBERATE or r.rule[i] != r.source[i]):
                out.append(
                    f"{label(r.state)} ({p}): DWD {yes(r.dwd)} rule {yes(r.rule)} source {yes(r.source)}"
                )
    differing = {(r.state, p) for r in rows for p in r.differs()}
    out += [
        f"DELIBERATE names {label(s)} ({p}), which agrees" for s, p in DELIBERATE if (s, p) not in differing
    ]
    return out


async def two_phases(states: list[ShootState], dwd: DependencyWatchdog, source: GardenerSource) -> list[Row]:
    """Every ``run-<i>`` created reconciled and running on both sides; then every ``new-<i>``
    created in its state and every ``run-<i>`` moved to it; the verdicts once both have seen it all."""
    writer = Writer(dwd.seed)
    started = time.monotonic()
    try:
        running = {f"run-{i}" for i in range(len(states))}
        await asyncio.to_thread(writer.write, [cluster(name) for name in sorted(running)])
        await asyncio.to_thread(
            wait_for, lambda: running <= dwd.probers(), WAIT_S, "DWD's run-<i> probers", 0.2
        )
        await serving(source, running)
        first = time.monotonic() - started
        new = [cluster(f"new-{i}", **s.fields()) for i, s in enumerate(states)]
        moved = [cluster(f"run-{i}", **s.fields()) for i, s in enumerate(states)]
        await asyncio.to_thread(writer.write, new, moved)
        await asyncio.to_thread(writer.write, [cluster(SENTINEL)])
    finally:
        writer.close()
    await asyncio.to_thread(dwd_settled, dwd)
    await seen(source, SENTINEL)
    desired, probers = set(await source.desired()), dwd.probers()
    print(
        f"\nphase 1 (run-<i> running) {first:.1f}s, phase 2 (new-<i>, run-<i> moved, all reconciled) "
        f"{time.monotonic() - started - first:.1f}s; DWD reconciles: {dwd.reconciles()}"
    )
    return [
        Row(
            s,
            ClusterView.from_object(new[i]),
            (f"new-{i}" in probers, f"run-{i}" in probers),
            (f"new-{i}" in desired, f"run-{i}" in desired),
        )
        for i, s in enumerate(states)
    ]


async def test_dwd_and_the_aggregator_give_the_same_shoots_a_target(
    seed: ControlPlane, tmp_path: Path
) -> None:
    dwd = DependencyWatchdog(seed, tmp_path / "dwd")
    await asyncio.to_thread(dwd.start)
    try:
        # The source's log names every skipped cluster on each change: a thousand, many times.
        with capture_logs():
            async with watching(seed) as source:
                rows = await two_phases(shoot_states(), dwd, source)
    finally:
        dwd.stop()
    print_table(rows)
    problems = undeliberate(rows)
    assert not problems, "\n".join([*problems, f"DWD's log: {tmp_path / 'dwd'}"])

"""The aggregator as the extension controller of a whole seed: every shoot's Extension created at
once, then the controller SIGKILLed and started again.

    python -m bench.extensions [--extensions 250] [--nodes 10]

A real seed kube-apiserver with Gardener's own Cluster and Extension CRDs; per shoot a
control-plane namespace with its Cluster (25 KB), the access Secret and the three dependents
(testenv/worlds/targets.py ``populate``), every shoot on one shared shoot API server whose
``--nodes`` simulated agents renew the leases every target judges (as bench/seed.py). The
aggregator runs with ``DWD_TARGETS=extension`` at its defaults (but no node grace: the nodes
are minutes old), its heartbeat in its own namespace (``POD_NAMESPACE``, as the chart's pod
has it). Its writes are read from the seed API server's audit log, which records its user
alone: what it wrote, not what it meant to. As in bench/seed.py, every target provisions the
same leases and their creates collide at start-up (``lease_name_taken_or_raced`` in its log):
the shared shoot's doing, not a seed's.

Created: the Extensions as gardenlet creates them, by 8 clients side by side, as gardenlet's
shoot flows run side by side; each read back every second and judged by gardenlet's own
function (``health.CheckExtensionObject``: "" is ready). Then, once every Extension's
``SystemComponentsHealthy`` is settled (two reads 10 s apart equal), the aggregator SIGKILLed
and started again; once every target judges again and 30 s more, the conditions that changed
in status, reason, message or lastTransitionTime (each a change gardenlet would carry into the
Shoot's status; the goal is none) and the writes to Extensions since the kill.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from aggregator.extension.contract import CONDITION, EXTENSIONS
from aggregator.extension.health import HEARTBEAT, LEASES
from bench.seed import status
from bench.tools.stats import min_median_max
from bench.tools.table import print_table
from core.errors import NotFound, TooManyRequests
from testenv.base.kapi import Client
from testenv.base.process import Process, stop_all
from testenv.base.wait import wait_for
from testenv.gardener.apply import RESOURCES, apply
from testenv.gardener.gardener_types import extension_verdicts
from testenv.gardener.seed_objects import CLUSTERS_PATH, EXTENSION_TYPE, extension, module_crds
from testenv.kube.audit import Audit, audit_args, audited_kubeconfig
from testenv.kube.controlplane import ControlPlane, ensure_namespace, free_port
from testenv.worlds.agent_fleet import Fleet, FleetThread
from testenv.worlds.aggregators import start_aggregator
from testenv.worlds.targets import access_kubeconfig, bench_env, namespace, populate

API_VERSION = "extensions.gardener.cloud/v1alpha1"
# The controller's own namespace, where the chart's pod runs and its heartbeat goes.
CONTROLLER_NS = "extension-dwd-lease"
HEARTBEAT_PATH = LEASES.format(ns=CONTROLLER_NS) + "/" + HEARTBEAT
# What gardenlet carries of our condition into the Shoot's: lastUpdateTime alone it ignores.
COMPARED = ("status", "reason", "message", "lastTransitionTime")
CREATORS = 8  # clients creating the Extensions side by side
Conditions = dict[str, tuple[str, ...]]  # namespace -> its condition's COMPARED fields
Writes = dict[str, collections.Counter[str]]  # namespace -> "status" / "object" / "refused" -> n


def extensions_path(ns: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{ns}/extensions"


@dataclass
class Rig:
    admin: Client
    seed_kubeconfig: Path
    tmp: Path
    audit: Audit
    count: int
    port: int = field(default_factory=free_port)
    procs: list[Process] = field(default_factory=list)
    # The heartbeat's renewTimes as sampled, each once, oldest first.
    beats: list[str] = field(default_factory=list)

    def start(self) -> Process:
        """The aggregator as the seed's extension controller, once it says it is ready."""
        n = len(self.procs)
        env = bench_env("extension") | {
            "DWD_METRICS_ADDR": f"127.0.0.1:{self.port}",
            "POD_NAMESPACE": CONTROLLER_NS,
        }
        log = self.tmp / f"aggregator-{n}.log"  # a log each: the first life's must survive the kill
        proc = start_aggregator(
            env, name=f"aggregator-{n}", log_path=log, seed_kubeconfig=self.seed_kubeconfig
        )
        self.procs.append(proc)
        wait_for(lambda: _ready(self.port), 60, f"the aggregator ready (log: {log})", every_s=0.1)
        return proc

    def read(self) -> list[dict[str, Any]]:
        """Our Extensions as the server has them, by namespace, whole as gardenlet's types
        decode them (a LIST's items lack apiVersion and kind); the heartbeat sampled beside."""
        self.sample_beat()
        items = self.admin.get(EXTENSIONS)["items"]
        ours = [{"apiVersion": API_VERSION, "kind": "Extension", **o} for o in items]
        ours = [o for o in ours if o["spec"]["type"] == EXTENSION_TYPE]
        return sorted(ours, key=lambda o: str(o["metadata"]["namespace"]))

    def sample_beat(self) -> None:
        with contextlib.suppress(NotFound):
            renewed = str(self.admin.get(HEARTBEAT_PATH)["spec"]["renewTime"])
            if not self.beats or self.beats[-1] != renewed:
                self.beats.append(renewed)

    def idle(self, seconds: float) -> None:
        """``seconds`` waited, the heartbeat sampled every 2 s (it beats every 30 s)."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            self.sample_beat()
            time.sleep(min(2.0, left))

    def judging(self) -> bool:
        """Every target listed on /status judging its shoot healthy: its verdict on a trusted
        view, not the phase a start reads from the records while the view opens."""
        with contextlib.suppress(OSError, ValueError):
            targets = status(self.port)["targets"]
            judged = [t for t in targets if t["phase"] == "healthy" and t["judging"]]
            return len(targets) == len(judged) == self.count
        return False


def _ready(port: int) -> bool:
    with (
        contextlib.suppress(OSError),
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r,
    ):
        return bool(r.status == 200)
    return False


def conditions(objs: list[dict[str, Any]]) -> Conditions:
    out: Conditions = {}
    for obj in objs:
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == CONDITION:
                out[obj["metadata"]["namespace"]] = tuple(str(c.get(k)) for k in COMPARED)
    return out


def writes(audit: Audit, start: int, end: int | None = None) -> Writes:
    """The aggregator's writes to Extensions between two marks of the audit log, by namespace:
    to the status subresource and to the object (finalizer, annotation) apart, and those
    answered with an error (a conflict, mostly) counted again as "refused"."""
    with open(audit.path, "rb") as f:
        f.seek(start)
        lines = (f.read() if end is None else f.read(end - start)).splitlines()
    out: Writes = collections.defaultdict(collections.Counter)
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        ref = event.get("objectRef") or {}
        if ref.get("resource") != "extensions" or event.get("verb") not in ("patch", "update"):
            continue
        counts = out[str(ref.get("namespace"))]
        counts["status" if ref.get("subresource") == "status" else "object"] += 1
        if (event.get("responseStatus") or {}).get("code", 200) >= 400:
            counts["refused"] += 1
    return out


def per_extension(w: Writes, count: int, kind: str) -> str:
    """min / median / max over every Extension (one never written counts 0), and the sum."""
    each = [w.get(namespace(i), collections.Counter())[kind] for i in range(count)]
    return f"{min_median_max(each, unit='', digits=0)} (min / median / max; {sum(each)} in all)"


def prepare(admin: Client, count: int, shoot: ControlPlane) -> None:
    """The shoots' namespaces populated, Gardener's own CRDs over the stand-in Cluster CRD
    ``populate`` serves (their schemas prune what Gardener's would), the controller's namespace."""
    RESOURCES.setdefault("Cluster", ("clusters", False))
    RESOURCES.setdefault("Extension", ("extensions", True))
    populate(admin, count, access_kubeconfig(shoot))
    apply(admin, module_crds("Cluster", "Extension"))

    def served() -> bool:
        with contextlib.suppress(NotFound, TooManyRequests):  # 429: a new CRD's storage starting
            admin.get(EXTENSIONS)
            admin.get(CLUSTERS_PATH)
            return True
        return False

    wait_for(served, 30, "Gardener's Cluster and Extension CRDs served", every_s=0.2)
    # A new CRD's first create waits 2 s on the API server, once: a dry run pays it here, so
    # that the time to ready is the controller's.
    ns = namespace(0)
    admin.request("POST", extensions_path(ns), extension(ns), params={"dryRun": "All"})
    ensure_namespace(admin, CONTROLLER_NS)


def create(connect: Callable[[], Client], namespaces: list[str]) -> None:
    with connect() as client:
        for ns in namespaces:
            client.create(extensions_path(ns), extension(ns))


def create_all(rig: Rig, connect: Callable[[], Client]) -> dict[str, Any]:
    """Every Extension created, then read every second until gardenlet's function counts all of
    them ready in one read: from the first create, that read's time and each one's first."""
    mark, t0 = rig.audit.mark(), time.monotonic()
    chunks = [[namespace(i) for i in range(k, rig.count, CREATORS)] for k in range(CREATORS)]
    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(partial(create, connect), chunks))
    created_s = time.monotonic() - t0
    first: dict[str, float] = {}
    while True:
        objs = rig.read()
        verdicts, at = extension_verdicts(objs), time.monotonic() - t0
        for obj, verdict in zip(objs, verdicts, strict=True):
            if not verdict:
                first.setdefault(obj["metadata"]["namespace"], at)
        if len(objs) == rig.count and not any(verdicts):
            break
        if at > 600:
            raise TimeoutError(f"{len(first)} of {rig.count} Extensions ready in 600 s: {verdicts[:3]}")
        time.sleep(1.0)
    return {"mark": mark, "t0": t0, "created_s": created_s, "ready_s": at, "each": list(first.values())}


def settle(rig: Rig) -> Conditions:
    """Every Extension's condition once two reads 10 s apart are equal."""

    def same_twice() -> Conditions | None:
        before = conditions(rig.read())
        rig.idle(10)
        after = conditions(rig.read())
        return after if after == before and len(after) == rig.count else None

    settled: Conditions = wait_for(same_twice, 600, "the Extensions' conditions settled", every_s=0)
    return settled


def restart(rig: Rig, before: Conditions) -> dict[str, Any]:
    """The aggregator SIGKILLed and started again; once every target judges again and 30 s more,
    the conditions changed and the writes to Extensions since the kill."""
    mark, beats, t0 = rig.audit.mark(), len(rig.beats), time.monotonic()
    killed_at = datetime.now(UTC)
    rig.procs[-1].kill()
    proc = rig.start()
    up_s = time.monotonic() - t0
    wait_for(rig.judging, 300, f"{rig.count} targets judging again (log: {proc.log_path})", every_s=0.5)
    judging_s = time.monotonic() - t0
    rig.idle(30)
    after = conditions(rig.read())
    changed = {ns: (before.get(ns), after.get(ns)) for ns in before.keys() | after.keys()}
    changed = {ns: pair for ns, pair in changed.items() if pair[0] != pair[1]}
    events = proc.events()
    return {
        "up_s": up_s,
        "judging_s": judging_s,
        "changed": changed,
        "writes": writes(rig.audit, mark),
        "beat_after": _after(rig.beats[beats:], killed_at),
        "told": told(events),
        "health_lines": [e for e in events if e.get("event") == "extension_health"],
    }


def told(events: list[dict[str, Any]]) -> str:
    """A process's warnings and errors, by event, most first."""
    tally = collections.Counter(str(e.get("event")) for e in events if e.get("level") in ("warning", "error"))
    return ", ".join(f"{k} {v}" for k, v in tally.most_common()) or "none"


def measure(count: int, nodes: int, tmp: Path) -> dict[str, Any]:
    audit_log = tmp / "audit.log"
    plane = ControlPlane(extra_apiserver_args=audit_args(tmp / "audit-policy.yaml", audit_log))
    with plane.running() as seed, ControlPlane().running() as shoot, seed.admin_client() as admin:
        prepare(admin, count, shoot)
        fleet = FleetThread(Fleet(shoot.url, shoot.ca_file, (str(shoot.admin.cert), str(shoot.admin.key))))
        kubeconfig = audited_kubeconfig(seed, tmp / "aggregator.kubeconfig")
        rig = Rig(admin, kubeconfig, tmp, Audit(audit_log), count)
        try:
            fleet.add(nodes)
            fleet.start_renewing()
            rig.start()
            created = create_all(rig, seed.admin_client)
            ready_mark = rig.audit.mark()
            before = settle(rig)
            settled_s = time.monotonic() - created["t0"]
            m = {"count": count, "nodes": nodes, "settled_s": settled_s, "before": before, **created}
            m |= {"until_ready": writes(rig.audit, created["mark"], ready_mark)}
            m |= {"until_settled": writes(rig.audit, created["mark"]), "beats_before": list(rig.beats)}
            m |= {"told": told(rig.procs[0].events())}
            m |= {"restart": restart(rig, before), "beats": list(rig.beats)}
            return m
        finally:
            stop_all(rig.procs)
            fleet.close()


def _beats(renewed: list[str]) -> str:
    """How many renewTimes were seen and the longest gap between two in a row."""
    times = [datetime.fromisoformat(r) for r in renewed]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    longest = f", at most {max(gaps):.1f} s apart" if gaps else ""
    return f"{len(renewed)} renewTimes seen{longest}"


def _after(renewed: list[str], killed_at: datetime) -> str:
    """The heartbeat's first renewal after the kill, in seconds after it."""
    later = [t for t in map(datetime.fromisoformat, renewed) if t > killed_at]
    return f"yes, {(later[0] - killed_at).total_seconds():.1f} s after the SIGKILL" if later else "no"


def _reasons(said: Conditions) -> str:
    tally = collections.Counter(f"{status_} {reason}" for status_, reason, *_ in said.values())
    return ", ".join(f"{k}: {n}" for k, n in tally.most_common())


def _refused(w: Writes) -> int:
    return sum(c["refused"] for c in w.values())


def created_rows(m: dict[str, Any]) -> list[list[object]]:
    n = m["count"]
    return [
        [f"Extensions created ({CREATORS} clients side by side)", f"{n} in {m['created_s']:.1f} s"],
        ["first create -> all ready by gardenlet's function (one read, every ~1 s)", f"{m['ready_s']:.1f} s"],
        ["first create -> each one first seen ready (min / median / max)", min_median_max(m["each"])],
        ["status writes per Extension until all ready", per_extension(m["until_ready"], n, "status")],
        ["status writes per Extension until settled", per_extension(m["until_settled"], n, "status")],
        ["object writes per Extension until settled", per_extension(m["until_settled"], n, "object")],
        ["writes answered with an error until settled", _refused(m["until_settled"])],
        ["first create -> conditions settled (two reads 10 s apart equal)", f"{m['settled_s']:.0f} s"],
        [f"{CONDITION} when settled", _reasons(m["before"])],
        ["heartbeat Lease until settled", _beats(m["beats_before"])],
        ["the process's warnings and errors until settled, by event", m["told"]],
    ]


def restart_rows(m: dict[str, Any]) -> list[list[object]]:
    r, n = m["restart"], m["count"]
    w: Writes = r["writes"]
    written = sum(1 for c in w.values() if c["status"] + c["object"])
    return [
        ["SIGKILL -> the new process ready", f"{r['up_s']:.1f} s"],
        [f"SIGKILL -> all {n} targets judging healthy on /status", f"{r['judging_s']:.1f} s"],
        [f"{CONDITION} changed 30 s after (any of {', '.join(COMPARED)})", f"{len(r['changed'])} of {n}"],
        ["status writes to Extensions, SIGKILL -> 30 s after", sum(c["status"] for c in w.values())],
        ["object writes to Extensions, the same span", sum(c["object"] for c in w.values())],
        ["Extensions written, the same span", f"{written} of {n}"],
        ["writes answered with an error, the same span", _refused(w)],
        ["heartbeat renewed after the restart", r["beat_after"]],
        ["heartbeat Lease over the whole run", _beats(m["beats"])],
        ["the new process's warnings and errors, by event", r["told"]],
    ]


def report(m: dict[str, Any]) -> None:
    n, nodes = m["count"], m["nodes"]
    where = f"one seed API server, one shoot API server with {nodes} nodes shared by every shoot"
    for title, rows in (
        (f"{n} Extensions created at once, one extension controller ({where})", created_rows(m)),
        (f"The same controller SIGKILLed and started again ({n} Extensions)", restart_rows(m)),
    ):
        print_table(title, ["what", "figure"], rows)
    # What a change would look like to whoever reads the figures: a few, in full, with the log's word.
    for ns, (was, now) in sorted(m["restart"]["changed"].items())[:5]:
        print(f"{ns}: {was} -> {now}")
    for line in m["restart"]["health_lines"][:5]:
        print(json.dumps(line))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.extensions")
    p.add_argument("--extensions", type=int, default=250, help="shoots, each with its Extension")
    p.add_argument("--nodes", type=int, default=10, help="simulated nodes of the shared shoot")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dwd-bench-extensions-"))
    print(f"logs and the audit log in {tmp}")
    report(measure(args.extensions, args.nodes, tmp))


if __name__ == "__main__":
    main()

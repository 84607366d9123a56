"""The test control plane is the real thing: real validation, conflicts, watches, RBAC, bound tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from core.errors import BadRequest, Conflict, Forbidden, Gone
from testenv.base import binaries
from testenv.base.process import spawn
from testenv.base.wait import wait_for
from testenv.kube.controlplane import ControlPlane, ensure_namespace

pytestmark = pytest.mark.integration

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


@pytest.fixture
def ns(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    test: str = request.node.name
    name = "t-" + test.lower().replace("_", "-")[:50].strip("-")
    with control_plane.admin_client() as c:
        ensure_namespace(c, name)
    return name


def test_version_is_the_pinned_release(control_plane: ControlPlane) -> None:
    with control_plane.admin_client() as c:
        version = c.get("/version")
    assert version["gitVersion"] == binaries.KUBE_APISERVER.version()
    assert version["gitVersion"].startswith("v1.3")


def test_micro_time_needs_six_fractional_digits(control_plane: ControlPlane, ns: str) -> None:
    with control_plane.admin_client() as c:
        with pytest.raises(BadRequest) as bad:
            c.create(
                LEASES.format(ns=ns),
                {"metadata": {"name": "three"}, "spec": {"renewTime": "2026-01-01T00:00:00.123Z"}},
            )
        assert 'as ".000000"' in str(bad.value)
        ok = c.create(
            LEASES.format(ns=ns),
            {"metadata": {"name": "six"}, "spec": {"renewTime": "2026-01-01T00:00:00.123456Z"}},
        )
    assert ok["spec"]["renewTime"] == "2026-01-01T00:00:00.123456Z"


def test_stale_resource_version_conflicts(control_plane: ControlPlane, ns: str) -> None:
    with control_plane.admin_client() as c:
        lease = c.create(LEASES.format(ns=ns), {"metadata": {"name": "a"}, "spec": {"holderIdentity": "x"}})
        c.merge_patch(f"{LEASES.format(ns=ns)}/a", {"spec": {"holderIdentity": "y"}})
        lease["spec"]["holderIdentity"] = "z"
        with pytest.raises(Conflict):
            c.put(f"{LEASES.format(ns=ns)}/a", lease)


def test_watch_sees_added_and_modified(control_plane: ControlPlane, ns: str) -> None:
    with control_plane.admin_client() as c:
        start_rv = c.get(LEASES.format(ns=ns))["metadata"]["resourceVersion"]
        c.create(LEASES.format(ns=ns), {"metadata": {"name": "w"}, "spec": {"holderIdentity": "x"}})
        c.merge_patch(f"{LEASES.format(ns=ns)}/w", {"spec": {"holderIdentity": "y"}})
        seen = []
        for event in c.watch(LEASES.format(ns=ns), timeout_s=5, resourceVersion=start_rv):
            seen.append((event["type"], event["object"]["spec"]["holderIdentity"]))
            if len(seen) == 2:
                break
    assert seen == [("ADDED", "x"), ("MODIFIED", "y")]


def test_watch_from_compacted_revision_is_gone() -> None:
    # A dedicated control plane: the API server is restarted, so its watch cache
    # starts at the compacted revision and can no longer serve the old one.
    with ControlPlane().running() as cp, cp.admin_client() as c:
        ensure_namespace(c, "gone")
        old_rv = c.create(LEASES.format(ns="gone"), {"metadata": {"name": "a"}})["metadata"][
            "resourceVersion"
        ]
        for i in range(3):
            c.merge_patch(f"{LEASES.format(ns='gone')}/a", {"spec": {"holderIdentity": f"h{i}"}})
        compacted = cp.compact_etcd()
        assert compacted > int(old_rv)
        cp.stop_apiserver()
        cp.start_apiserver()
        with pytest.raises(Gone):
            next(iter(c.watch(LEASES.format(ns="gone"), timeout_s=5, resourceVersion=old_rv)))


def test_rbac_denies_then_allows(control_plane: ControlPlane, ns: str) -> None:
    with control_plane.admin_client() as admin:
        admin.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "sa"}})
        token = admin.create(
            f"/api/v1/namespaces/{ns}/serviceaccounts/sa/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
        with control_plane.token_client(token) as as_sa:
            with pytest.raises(Forbidden):
                as_sa.get(LEASES.format(ns=ns))
            admin.create(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
                {
                    "metadata": {"name": "read-leases"},
                    "rules": [
                        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}
                    ],
                },
            )
            admin.create(
                f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
                {
                    "metadata": {"name": "read-leases"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "read-leases",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": ns}],
                },
            )

            def leases() -> dict[str, Any] | None:
                try:
                    return as_sa.get(LEASES.format(ns=ns))
                except Forbidden:
                    return None

            # The RBAC authorizer reads from an informer: the binding takes a moment.
            assert wait_for(leases, 10, "the Role bound", every_s=0.1)["kind"] == "LeaseList"


def test_node_bound_token_carries_the_node(control_plane: ControlPlane) -> None:
    token = control_plane.node_token("n1")
    with control_plane.token_client(token) as c:
        review = c.create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    user = review["status"]["userInfo"]
    assert user["username"] == "system:serviceaccount:kube-system:dwd-lease-agent"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == ["n1"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes only once reaped; /proc tells.
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_stop_leaves_no_process_and_no_directory() -> None:
    cp = ControlPlane()
    cp.start()
    pids, workdir = cp.pids(), cp.workdir
    assert len(pids) == 2
    assert all(_alive(p) for p in pids)
    cp.stop()
    assert not any(_alive(p) for p in pids)
    assert not workdir.exists()


def test_run_command_exit_code_and_cleanup_on_interrupt(tmp_path: Path) -> None:
    out = tmp_path / "env"
    rc = subprocess.call(
        [
            sys.executable,
            "-m",
            "testenv",
            "run",
            "--",
            "sh",
            "-c",
            f'echo "$KUBECONFIG $TESTENV_URL" > {out}; exit 7',
        ],
    )
    assert rc == 7
    kubeconfig, url = out.read_text().split()
    assert url.startswith("https://127.0.0.1:")
    assert not Path(kubeconfig).exists(), "the control plane's directory outlived the run"

    # Interrupted while its command runs: everything it started goes away.
    proc = spawn(
        "testenv-run",
        [sys.executable, "-m", "testenv", "run", "--", "sh", "-c", f"echo $TESTENV_URL > {out}.2; sleep 60"],
        log_path=tmp_path / "run.log",
    )
    try:
        wait_for(lambda: (tmp_path / "env.2").exists() or not proc.alive(), 60, "the command started", 0.1)
        assert (tmp_path / "env.2").exists(), f"testenv run exited early:\n{proc.tail()}"
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        assert len(children) >= 2  # etcd, kube-apiserver (and the command)
        proc.popen.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130  # each process gets 10 s after SIGTERM: generous under load
    finally:
        proc.stop()  # a failure here must not leave it running into the next test
    time.sleep(0.2)
    assert not any(_alive(int(p)) for p in children)


DEMO_WORLD = """
import sys
from pathlib import Path
from demo.scenario import world
with world(2, Path(sys.argv[1]), print) as w:
    print("world up:", w.names)
"""


@pytest.mark.timeout(180)
def test_the_demos_world_runs_on_what_build_demo_builds(tmp_path: Path) -> None:
    """``make demo`` builds only kube-apiserver, KCM, kubemark and etcd; its world must start
    with a cache that holds those alone. Before, a cold ``make demo`` built them and then
    failed: the control plane asked for every testenv binary, kustomize among them."""
    cache = tmp_path / "cache"
    for component in (
        binaries.KUBE_APISERVER,
        binaries.KUBE_CONTROLLER_MANAGER,
        binaries.KUBEMARK,
        binaries.ETCD,
    ):
        link = cache / binaries.cache_dir(component).relative_to(binaries.cache_root())
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(binaries.cache_dir(component))
    (tmp_path / "work").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", DEMO_WORLD, str(tmp_path / "work")],
        env={**os.environ, "DWDDEV_TESTENV_CACHE": str(cache)},
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert out.returncode == 0 and "world up:" in out.stdout, out.stderr[-2000:]

"""Start and stop a real etcd + kube-apiserver on loopback, the way envtest does.

Random ports, a temporary directory with generated certificates, an admin
client certificate in system:masters, service-account signing keys, Node and
RBAC authorization, default admission plugins (ValidatingAdmissionPolicy among
them). There are no controllers: nothing garbage-collects or reconciles.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import socket
import ssl
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from testenv.base import binaries
from testenv.base.kapi import Client
from testenv.base.pki import CertificateAuthority, KeyPair, service_account_keys
from testenv.base.process import Process, spawn
from testenv.base.wait import wait_for


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, below the kernel's ephemeral range: one from that range (what
    binding port 0 gives) can be taken by any outgoing connection between this check and the
    bind of the program it is for; a hollow kubelet lost its port so while the tests ran.

    Between this check and that bind the port is still free to anyone: so a port is handed out
    once per process (until all of its share were), and each pytest-xdist worker has a share of
    the range of its own (two workers picked the same one for two hollow kubelets)."""
    low, high = _port_share(EPHEMERAL_FLOOR, _ephemeral_low())
    if len(_HANDED_OUT) >= (high - low) // 2:
        _HANDED_OUT.clear()
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port on {host} in {low}-{high - 1}")


_HANDED_OUT: set[int] = set()


def _port_share(low: int, high: int) -> tuple[int, int]:
    """This process's part of [low, high): the whole of it, or under pytest-xdist its worker's
    (gw0, gw1, ...) part, the range cut into as many parts as there are workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit() and int(workers) > 0):
        return low, high
    size = (high - low) // int(workers)
    start = low + (int(worker[2:]) % int(workers)) * size
    return start, start + size


# Below the ports that services of this machine are likely to hold.
EPHEMERAL_FLOOR = 20000


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    except OSError:
        return 32768  # Linux's default
    return max(int(text.split()[0]), EPHEMERAL_FLOOR + 1000)


@dataclass
class ControlPlane:
    """A running control plane; use ``start()``/``stop()`` or the ``running()`` context manager."""

    extra_sans: Sequence[str] = ()
    extra_apiserver_args: Sequence[str] = ()
    # The aggregation layer on (front-proxy certificates, request headers): an API server of
    # another's, registered by an APIService, is reached through this one (testenv/gardener/garden.py).
    aggregation: bool = False
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dwd-testenv-")))
    url: str = ""
    etcd_url: str = ""
    _procs: list[Process] = field(default_factory=list)
    _apiserver_argv: list[str] = field(default_factory=list)
    # Kept so a proxy in front of this API server can get a serving certificate its clients trust.
    ca: CertificateAuthority | None = field(default=None, init=False, repr=False)

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def admin(self) -> KeyPair:
        return KeyPair(self.workdir / "pki" / "admin.crt", self.workdir / "pki" / "admin.key")

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def start(self, timeout_s: float = 90.0) -> ControlPlane:
        paths = binaries.find((binaries.KUBE_APISERVER, binaries.ETCD))
        pki = self.workdir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca = self.ca = CertificateAuthority(pki)
        names = ["localhost", *[s for s in self.extra_sans if not _is_ip(s)]]
        ips = ["127.0.0.1", *[s for s in self.extra_sans if _is_ip(s)]]
        serving = ca.issue("apiserver", "kube-apiserver", dns_names=names, ip_addresses=ips, server=True)
        ca.issue("admin", "admin", organizations=["system:masters"])
        sa = service_account_keys(pki)
        try:
            self._start_etcd(paths["etcd"], timeout_s)
            self._start_apiserver(paths["kube-apiserver"], serving, sa, timeout_s)
        except BaseException:
            self.stop()
            raise
        self._write_kubeconfig()
        return self

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = spawn(name, argv, log_path=self.workdir / f"{name}.log", die_with_parent=True)
        self._procs.append(proc)  # stopped in reverse by stop()
        return proc

    def _start_etcd(self, binary: Path, timeout_s: float) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        proc = self._spawn(
            "etcd",
            [
                str(binary),
                "--name=testenv",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testenv={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait(proc, f"{self.etcd_url}/health", None, timeout_s)

    def _start_apiserver(self, binary: Path, serving: KeyPair, sa: KeyPair, timeout_s: float) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        pki = self.workdir / "pki"
        self._apiserver_argv = [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-account-issuer={self.url}/",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *(self._aggregation_args() if self.aggregation else ()),
            *self.extra_apiserver_args,
        ]
        self._run_apiserver(timeout_s)

    def _aggregation_args(self) -> list[str]:
        """kube-apiserver's front proxy, as kubeadm sets it up: a CA of its own, whose client
        certificate (``front-proxy-client``) it presents to an aggregated API server, which
        takes the user from the request headers it vouches for."""
        pki = self.workdir / "pki" / "front-proxy"
        pki.mkdir(parents=True, exist_ok=True)
        client = CertificateAuthority(pki, "front-proxy-ca").issue("client", "front-proxy-client")
        return [
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={client.cert}",
            f"--proxy-client-key-file={client.key}",
        ]

    def _run_apiserver(self, timeout_s: float) -> None:
        proc = self._spawn("kube-apiserver", self._apiserver_argv)
        self._wait(proc, f"{self.url}/readyz", self.admin, timeout_s)

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (etcd keeps the data): KAPI is down until start_apiserver()."""
        for proc in [p for p in self._procs if p.name == "kube-apiserver"]:
            proc.stop()
            self._procs.remove(proc)

    def start_apiserver(self, timeout_s: float = 90.0) -> None:
        """Start kube-apiserver again on the same port; its watch cache starts at etcd's current
        revision. Returns once /readyz answers 200 (watches and lists answer a few seconds
        before it does, more under load)."""
        self._run_apiserver(timeout_s)

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision (what kube-apiserver does every 5 minutes); returns it."""
        with httpx.Client(trust_env=False, timeout=10) as http:
            status = http.post(f"{self.etcd_url}/v3/kv/range", json={"key": "Lw==", "limits": 1}).json()
            revision = int(status["header"]["revision"])
            http.post(
                f"{self.etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True}
            ).raise_for_status()
            return revision

    def _wait(self, proc: Process, url: str, cert: KeyPair | None, timeout_s: float) -> None:
        verify: ssl.SSLContext | bool = False
        if url.startswith("https"):
            verify = ssl.create_default_context(cafile=str(self.ca_file))
            if cert is not None:
                verify.load_cert_chain(str(cert.cert), str(cert.key))
        with httpx.Client(verify=verify, timeout=2.0, trust_env=False) as http:

            def ready() -> bool:
                if not proc.alive():
                    raise RuntimeError(
                        f"{proc.name} exited with {proc.popen.returncode} while starting:\n{proc.tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    return http.get(url).status_code == 200
                return False

            try:
                wait_for(ready, timeout_s, f"{proc.name} at {url}", every_s=0.1, error=TimeoutError)
            except TimeoutError:
                raise RuntimeError(
                    f"{proc.name} not ready at {url} after {timeout_s}s:\n{proc.tail()}"
                ) from None

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(
            kubeconfig_yaml(
                self.url,
                self.ca_file,
                user={"client-certificate": str(self.admin.cert), "client-key": str(self.admin.key)},
            )
        )

    def stop(self) -> None:
        # kube-apiserver first: it must not spend its shutdown retrying a dead etcd.
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def admin_client(self) -> Client:
        return Client(self.url, str(self.ca_file), cert=(str(self.admin.cert), str(self.admin.key)))

    def token_client(self, token: str) -> Client:
        return Client(self.url, str(self.ca_file), token=token)

    def node_token(
        self,
        node: str,
        *,
        namespace: str = "kube-system",
        service_account: str = "dwd-lease-agent",
        expiration_s: int = 3600,
        pod: str = "",
    ) -> str:
        """A service-account token bound to a Pod scheduled on ``node``, as kubelet would mount it.

        Requests made with it carry ``authentication.kubernetes.io/node-name`` in the user's extra.
        """
        with self.admin_client() as c:
            ensure_namespace(c, namespace)
            c.ensure(f"/api/v1/namespaces/{namespace}/serviceaccounts", _meta(service_account))
            ensure_node(c, node)
            pod_obj = c.ensure(
                f"/api/v1/namespaces/{namespace}/pods",
                {
                    "metadata": {"name": pod or f"{service_account}-{node}"[:63].rstrip("-.")},
                    "spec": {
                        "nodeName": node,
                        "serviceAccountName": service_account,
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "agent", "image": "dwd-lease-agent"}],
                    },
                },
            )
            review = c.create(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {
                        "expirationSeconds": expiration_s,
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": pod_obj["metadata"]["name"],
                            "uid": pod_obj["metadata"]["uid"],
                        },
                    },
                },
            )
            token: str = review["status"]["token"]
            return token

    @contextlib.contextmanager
    def running(self) -> Iterator[ControlPlane]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


def _is_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
    except ValueError:
        return False
    return True


def _meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **extra}}


def ensure_namespace(c: Client, name: str) -> None:
    c.ensure("/api/v1/namespaces", _meta(name))


def ensure_node(c: Client, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return c.ensure("/api/v1/nodes", _meta(name, labels=labels or {}))


def kubeconfig_yaml(url: str, ca_file: Path | str, user: dict[str, str]) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "testenv", "cluster": {"server": url, "certificate-authority": str(ca_file)}}
            ],
            "users": [{"name": "testenv", "user": user}],
            "contexts": [{"name": "testenv", "context": {"cluster": "testenv", "user": "testenv"}}],
            "current-context": "testenv",
        }
    )


def env_for(cp: ControlPlane) -> dict[str, str]:
    return {"KUBECONFIG": str(cp.kubeconfig), "TESTENV_URL": cp.url, "TESTENV_CA": str(cp.ca_file)}

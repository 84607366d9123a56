"""The agent takes kubelet's server and CA from the node's kubelet kubeconfig, and nothing else."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from agent.client import LeaseClient
from agent.kubeconfig import KubeconfigError, read_endpoint
from agent.settings import Settings
from core.config import ConfigError
from core.errors import TransportError
from testenv.base.pki import CertificateAuthority
from testenv.kube.kubelet_identity import write_kubeconfig

SERVER = "https://api.internal.shoot.example"


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    d = tmp_path / "ca"
    d.mkdir()
    return CertificateAuthority(d, "kubelet-kubeconfig-ca")


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    return {"NODE_NAME": "n1", "DWD_TOKEN_FILE": str(token)}


def kubeconfig(path: Path, **cluster: Any) -> Path:
    """A kubeconfig of one cluster (``cluster`` its fields) and one user."""
    user = cluster.pop("user", {"client-certificate": "/var/lib/kubelet/pki/kubelet-client-current.pem"})
    doc = {
        "current-context": "kubelet",
        "clusters": [{"name": "c", "cluster": {"server": SERVER, **cluster}}],
        "contexts": [{"name": "kubelet", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(json.dumps(doc))
    return path


def subjects(settings: Settings) -> list[Any]:
    return [c["subject"] for c in settings.tls().get_ca_certs()]


def test_the_server_and_ca_come_from_the_kubelet_kubeconfig(
    tmp_path: Path, ca: CertificateAuthority, base: dict[str, str]
) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig-real", SERVER + "/", ca.cert_path.read_bytes())
    s = Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    assert s.apiserver_url == SERVER
    assert (s.kubelet_kubeconfig, s.ca_file) == (str(path), "")
    assert subjects(s) == [((("commonName", "kubelet-kubeconfig-ca"),),)]


def test_dwd_apiserver_url_overrides_and_the_kubeconfig_is_not_read(base: dict[str, str]) -> None:
    s = Settings.from_env(
        {**base, "DWD_APISERVER_URL": "https://api.other.example", "DWD_KUBELET_KUBECONFIG": "/nonexistent"}
    )
    assert (s.apiserver_url, s.kubelet_kubeconfig, s.ca_pem) == ("https://api.other.example", "", "")


def test_neither_a_kubeconfig_nor_a_url_is_an_error_naming_both(base: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "kubeconfig-real"
    with pytest.raises(ConfigError) as e:
        Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(missing)})
    (problem,) = e.value.problems
    assert problem.startswith(f"DWD_KUBELET_KUBECONFIG: {missing}: No such file")
    assert "or set DWD_APISERVER_URL" in problem


@pytest.mark.parametrize(
    "user",
    [
        {"client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"},
        {"token": "abcdef.0123456789abcdef"},  # a bootstrap token
        {"username": "admin", "password": "secret"},
    ],
)
def test_a_kubeconfig_that_embeds_a_credential_is_refused(
    tmp_path: Path, base: dict[str, str], user: dict[str, str]
) -> None:
    path = kubeconfig(tmp_path / "kubeconfig", user=user)
    with pytest.raises(ConfigError) as e:
        Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    (problem,) = e.value.problems
    secret = next(k for k in ("client-key-data", "token", "password") if k in user)
    assert f"{path} embeds credentials (users[u].{secret})" in problem
    assert "must not be mounted into the agent" in problem
    assert "DWD_APISERVER_URL" in problem


def test_a_ca_by_path_is_read_relative_to_the_kubeconfig(
    tmp_path: Path, ca: CertificateAuthority, base: dict[str, str]
) -> None:
    (tmp_path / "ca.crt").write_bytes(ca.cert_path.read_bytes())
    path = kubeconfig(tmp_path / "kubeconfig", **{"certificate-authority": "ca.crt"})
    s = Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    assert s.ca_file == str(tmp_path / "ca.crt")
    assert len(subjects(s)) == 1


def test_a_ca_path_that_is_not_mounted_says_what_to_do(
    tmp_path: Path, base: dict[str, str], ca: CertificateAuthority
) -> None:
    path = kubeconfig(tmp_path / "kubeconfig", **{"certificate-authority": "/var/lib/kubelet/ca.crt"})
    with pytest.raises(ConfigError, match=r"certificate-authority /var/lib/kubelet/ca.crt is not readable"):
        Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    # DWD_CA_FILE replaces it.
    (tmp_path / "own.crt").write_bytes(ca.cert_path.read_bytes())
    s = Settings.from_env(
        {**base, "DWD_KUBELET_KUBECONFIG": str(path), "DWD_CA_FILE": str(tmp_path / "own.crt")}
    )
    assert (s.apiserver_url, s.ca_file) == (SERVER, str(tmp_path / "own.crt"))


def test_a_ca_or_kubeconfig_that_cannot_be_read_is_a_named_setting_error(
    tmp_path: Path, base: dict[str, str]
) -> None:
    """Not a traceback with rc 1 at the first renewal: rc 2 and the setting named."""
    (tmp_path / "not-a-ca").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"DWD_CA_FILE: .*not-a-ca: not a CA certificate bundle"):
        Settings.from_env({**base, "DWD_APISERVER_URL": SERVER, "DWD_CA_FILE": str(tmp_path / "not-a-ca")})
    # A kubeconfig whose certificate-authority is a file of garbage (a traceback with rc 1 before).
    config = tmp_path / "kubeconfig-ca-path"
    config.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "c", "cluster": {"server": SERVER, "certificate-authority": "not-a-ca"}}
                ],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
                "users": [{"name": "u", "user": {}}],
            }
        )
    )
    named = r"DWD_KUBELET_KUBECONFIG: .*kubeconfig-ca-path: its certificate-authority .*not-a-ca: not a CA"
    with pytest.raises(ConfigError, match=named):
        Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(config)})
    (tmp_path / "latin1").write_bytes(b"server: caf\xe9")
    with pytest.raises(ConfigError, match=r"DWD_KUBELET_KUBECONFIG: .*latin1: not UTF-8 text"):
        Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(tmp_path / "latin1")})


def test_a_ca_unreadable_mid_rotation_keeps_the_one_in_use(
    tmp_path: Path, ca: CertificateAuthority, base: dict[str, str]
) -> None:
    own = tmp_path / "own.crt"
    own.write_bytes(ca.cert_path.read_bytes())
    s = Settings.from_env({**base, "DWD_APISERVER_URL": SERVER, "DWD_CA_FILE": str(own)})
    client = LeaseClient.for_settings(s)
    before = client._ssl
    own.write_text("half written")
    assert "NO_CERTIFICATE" in client.reload_tls()
    assert client._ssl is before
    own.write_bytes(ca.cert_path.read_bytes())
    assert client.reload_tls() == "" and client._ssl is not before


def test_a_rotated_ca_is_read_again(tmp_path: Path, ca: CertificateAuthority, base: dict[str, str]) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig-real", SERVER, ca.cert_path.read_bytes())
    s = Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    (tmp_path / "new").mkdir()
    rotated = CertificateAuthority(tmp_path / "new", "rotated-ca")
    write_kubeconfig(path, SERVER, rotated.cert_path.read_bytes())
    assert subjects(s) == [((("commonName", "rotated-ca"),),)]
    path.write_text("half written: {")  # caught mid-rewrite: the CA read at start stays
    assert subjects(s) == [((("commonName", "kubelet-kubeconfig-ca"),),)]


def one(cluster: dict[str, Any]) -> str:
    """A kubeconfig whose current context names this cluster (and no user)."""
    context = {"name": "c", "context": {"cluster": "c"}}
    return json.dumps(
        {"current-context": "c", "clusters": [{"name": "c", "cluster": cluster}], "contexts": [context]}
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a: [", "not valid YAML (line 2, column 1"),
        ("- 1\n- 2\n", "no mapping at the top"),
        (one({}), "the current cluster has no server"),
        (
            json.dumps({"current-context": "x", "contexts": []}),
            "current-context 'x' is not among its contexts",
        ),
        # client-go reads no cluster without one, not even the only one there is.
        (json.dumps({"clusters": [{"name": "a", "cluster": {"server": SERVER}}]}), "no current-context"),
        (json.dumps({"clusters": "c"}), "clusters is not a list"),
        (one({"server": SERVER, "insecure-skip-tls-verify": True}), "insecure-skip-tls-verify is set"),
        (one({"server": SERVER, "proxy-url": "http://proxy:3128"}), "proxy-url is set"),
        (one({"server": SERVER + "/k8s/clusters/c-1"}), f"server '{SERVER}/k8s/clusters/c-1' has a path"),
        (
            one({"server": SERVER, "certificate-authority": "ca.crt", "certificate-authority-data": "eA=="}),
            "both certificate-authority-data and certificate-authority",
        ),
    ],
)
def test_a_broken_kubeconfig_names_itself_and_what_is_wrong(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeconfigError) as e:
        read_endpoint(str(path))
    assert str(e.value).startswith(f"{path}: ")
    assert why in str(e.value)


def test_ca_data_that_is_not_a_certificate_is_refused(tmp_path: Path) -> None:
    bad = kubeconfig(tmp_path / "a", **{"certificate-authority-data": "not base64!"})
    with pytest.raises(KubeconfigError, match="is not base64 of a PEM"):
        read_endpoint(str(bad))
    text = kubeconfig(tmp_path / "b", **{"certificate-authority-data": base64.b64encode(b"hello").decode()})
    with pytest.raises(KubeconfigError, match="holds no PEM certificate"):
        read_endpoint(str(text))


def test_a_kubeconfig_server_that_is_not_https_is_named(tmp_path: Path, base: dict[str, str]) -> None:
    path = kubeconfig(tmp_path / "kubeconfig", server="http://api.internal.example")
    with pytest.raises(ConfigError) as e:
        Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    assert e.value.problems == [
        f"DWD_KUBELET_KUBECONFIG: {path}: server 'http://api.internal.example' "
        "is not an https URL with a host name"
    ]


def wrapped(pem: bytes, *, newline: str = "\n") -> str:
    """Base64 as coreutils' ``base64`` writes it: 76 columns a line, a newline at the end."""
    flat = base64.b64encode(pem).decode()
    return newline.join(flat[i : i + 76] for i in range(0, len(flat), 76)) + newline


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_ca_data_wrapped_at_76_columns_is_read_as_client_go_reads_it(
    tmp_path: Path, ca: CertificateAuthority, base: dict[str, str], newline: str
) -> None:
    """A CA pasted from ``base64 ca.crt`` into a literal block: Go's base64 skips the line ends
    (client-go and 0.2.0 read it); a strict decoder refused it and the agent never started."""
    data = wrapped(ca.cert_path.read_bytes(), newline=newline)
    assert "\n" in data.strip()
    path = kubeconfig(tmp_path / "kubeconfig", **{"certificate-authority-data": data})
    s = Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    assert subjects(s) == [((("commonName", "kubelet-kubeconfig-ca"),),)]


TLS_NAME = "api.internal.shoot.example"  # the only name the server's certificate carries


@pytest.fixture
async def kapi_by_name(tmp_path: Path, ca: CertificateAuthority) -> AsyncIterator[tuple[int, list[Any]]]:
    """A lease endpoint on loopback whose certificate is for TLS_NAME only, not for 127.0.0.1;
    it records the server name (SNI) and Host header of every request."""
    served = ca.issue("kapi", TLS_NAME, dns_names=[TLS_NAME], server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(served.cert, served.key)
    seen: list[Any] = []
    context.sni_callback = lambda _sock, name, _ctx: seen.append(("sni", name))

    async def lease(request: web.Request) -> web.Response:
        seen.append(("host", request.headers.get("Host")))
        return web.json_response({"kind": "Lease", "metadata": {"name": "n1"}})

    app = web.Application()
    app.router.add_route("PATCH", "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}", lease)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


async def test_tls_server_name_is_the_name_the_agent_sends_and_verifies(
    tmp_path: Path, ca: CertificateAuthority, base: dict[str, str], kapi_by_name: tuple[int, list[Any]]
) -> None:
    """Kubelet reaches KAPI by an address and checks its certificate against ``tls-server-name``
    (and sends it as SNI, which an SNI ingress routes by); the agent must too, or every
    renewal fails the certificate check. The Host header stays the server's, as client-go's."""
    port, seen = kapi_by_name
    server = f"https://127.0.0.1:{port}"
    cluster = {"server": server, "tls-server-name": TLS_NAME}
    cluster["certificate-authority-data"] = base64.b64encode(ca.cert_path.read_bytes()).decode()
    path = kubeconfig(tmp_path / "kubeconfig", **cluster)
    s = Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)})
    client = LeaseClient.for_settings(s)
    try:
        lease = await client.patch({"spec": {}}, window_s=5)
    finally:
        await client.aclose()
    assert lease["kind"] == "Lease"
    assert seen == [("sni", TLS_NAME), ("host", f"127.0.0.1:{port}")]


async def test_without_tls_server_name_the_address_is_verified_and_refused(
    tmp_path: Path, ca: CertificateAuthority, base: dict[str, str], kapi_by_name: tuple[int, list[Any]]
) -> None:
    """The check above is real: the certificate does not carry 127.0.0.1."""
    port, _ = kapi_by_name
    path = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", ca.cert_path.read_bytes())
    client = LeaseClient.for_settings(Settings.from_env({**base, "DWD_KUBELET_KUBECONFIG": str(path)}))
    try:
        with pytest.raises(TransportError) as refused:
            await client.patch({"spec": {}}, window_s=5)
    finally:
        await client.aclose()
    assert refused.value.failure_class == "tls", refused.value

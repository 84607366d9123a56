"""The one reader of data-only kubeconfigs (core/kubeconfig.py), where the aggregator meets it:
a Secret's kubeconfig with a client certificate as data and a ``tls-server-name``, against a
real TLS server on loopback that requires the certificate. No ``kubernetes`` loader on this
path, and nothing left on disk."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes.config
import pytest
from aiohttp import web

from aggregator.kube.client import KubeClient
from aggregator.kube.endpoint import Endpoint, load_kubeconfig_dict
from core import kubeconfig
from core.errors import KubeconfigError, TransportError
from testenv.base.pki import CertificateAuthority

NAME = "kapi.shoot--p--a.internal"  # the only name the server's certificate carries


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture
async def kapi(tmp_path: Path) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """A server that requires a client certificate of its CA and answers with the CN it saw;
    and a Secret's kubeconfig that reaches it (its port, the kubeconfig)."""
    ca = CertificateAuthority(tmp_path)
    served = ca.issue("server", NAME, dns_names=[NAME], server=True)
    user = ca.issue("user", "dwd-lease-aggregator", organizations=["dwd"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert_path))
    context.load_cert_chain(served.cert, served.key)
    context.verify_mode = ssl.CERT_REQUIRED

    async def who(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(x[0] for x in (peer or {}).get("subject", ()))
        return web.json_response({"cn": subject.get("commonName", "")})

    app = web.Application()
    app.router.add_get("/version", who)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    port = runner.addresses[0][1]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [
            {
                "name": "k",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": b64(ca.cert_path),
                    "tls-server-name": NAME,
                },
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {"client-certificate-data": b64(user.cert), "client-key-data": b64(user.key)},
            }
        ],
    }
    try:
        yield port, config
    finally:
        await runner.cleanup()


async def answer(endpoint: Endpoint) -> dict[str, Any]:
    client = KubeClient(lambda: endpoint)
    try:
        return await client.get("/version")
    finally:
        await client.close()


async def test_a_secrets_client_certificate_reaches_the_server_by_its_tls_server_name(
    kapi: tuple[int, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Read without the ``kubernetes`` loader (it would fail here), the certificate as data
    presented, the server checked against ``tls-server-name`` and not the address dialled,
    and no file of the key left behind (the loader wrote its data to temporary files that
    outlived the request)."""
    _, config = kapi

    def no_loader(**_: Any) -> None:
        raise AssertionError("the kubernetes loader read a Secret's kubeconfig")

    monkeypatch.setattr(kubernetes.config, "load_kube_config_from_dict", no_loader)
    # A temporary directory of its own: the machine's is shared with whatever else runs.
    own = tmp_path / "tempdir"
    own.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    endpoint = load_kubeconfig_dict(config, "secret shoot--p--a/access", data_only=True)
    assert os.listdir(own) == []
    assert endpoint.server_name == NAME and endpoint.headers() == {}
    assert await answer(endpoint) == {"cn": "dwd-lease-aggregator"}


async def test_without_tls_server_name_the_address_is_checked_and_refused(
    kapi: tuple[int, dict[str, Any]],
) -> None:
    """The check is real: the certificate does not carry 127.0.0.1."""
    _, config = kapi
    del config["clusters"][0]["cluster"]["tls-server-name"]
    endpoint = load_kubeconfig_dict(config, "secret shoot--p--a/access", data_only=True)
    with pytest.raises(TransportError) as refused:
        await answer(endpoint)
    assert refused.value.failure_class == "tls", refused.value


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"client-key-data": None}, "client-certificate-data and client-key-data go together"),
        ({"client-key-data": base64.b64encode(b"not a key").decode()}, "client-key-data holds no PEM"),
        ({"client-certificate-data": "%%%"}, "client-certificate-data is not base64 of a PEM"),
        ({"client-certificate-data": None, "client-key-data": None}, "has no token or client certificate"),
    ],
)
def test_bad_credentials_as_data_name_the_secret_and_the_field(
    kapi: tuple[int, dict[str, Any]], change: dict[str, str | None], says: str
) -> None:
    _, config = kapi
    user = config["users"][0]["user"]
    for key, value in change.items():
        if value is None:
            user.pop(key)
        else:
            user[key] = value
    with pytest.raises(KubeconfigError) as refused:
        load_kubeconfig_dict(config, "secret shoot--p--a/access", data_only=True)
    assert str(refused.value).startswith("kubeconfig secret shoot--p--a/access: ") and says in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"clusters": [{"name": "a", "cluster": {}}, {"name": "b", "cluster": {}}]}, "no current-context"),
        ({"current-context": "x", "contexts": []}, "current-context 'x' is not among its contexts"),
        (
            {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "gone"}}]},
            "cluster 'gone' of the current context is not in the file",
        ),
        ({"clusters": {"name": "k"}}, "clusters is not a list"),
        (
            {
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k"}}],
                "clusters": [{"name": "k", "cluster": {}}],
            },
            "the current cluster has no server",
        ),
    ],
)
def test_the_current_context_is_resolved_or_what_is_missing_is_named(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(KubeconfigError, match=says):
        _ = kubeconfig.current(doc, "f").server


def test_without_a_current_context_not_even_the_one_cluster_is_read() -> None:
    """As client-go: "no configuration has been provided" (0.2.0 took the only cluster)."""
    doc = {
        "clusters": [{"name": "k", "cluster": {"server": "https://a:1/"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    for current in ({}, {"current-context": ""}):
        with pytest.raises(KubeconfigError, match="f: no current-context"):
            kubeconfig.current({**doc, **current}, "f")


def test_a_context_whose_user_is_not_in_the_file_has_an_empty_user() -> None:
    """client-go reads it as no credentials, not as an error."""
    doc = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "gone"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://a:1/"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }
    context = kubeconfig.current(doc, "f")
    assert (context.server, dict(context.user)) == ("https://a:1", {})


def wrapped(data: bytes, newline: str = "\n", width: int = 76) -> str:
    """Base64 as coreutils' ``base64`` writes it (76 columns, a newline at the end)."""
    flat = base64.b64encode(data).decode()
    return newline.join(flat[i : i + width] for i in range(0, len(flat), width)) + newline


# Its base64 ends in one "=", with b"xy" in two, with b"x" in none.
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    "data",
    [
        wrapped(PEM),
        wrapped(PEM, "\r\n"),
        wrapped(PEM + b"xy", width=5),
        wrapped(PEM + b"x", width=8),
        "\n" + base64.b64encode(PEM).decode(),
    ],
    ids=["76-columns-padded", "crlf", "padded-twice-5-columns", "unpadded-8-columns", "leading-newline"],
)
def test_base64_with_line_ends_anywhere_is_read_as_go_reads_it(data: str) -> None:
    """Go's base64.StdEncoding (which decodes every ``[]byte`` field of a kubeconfig for
    client-go) skips CR and LF wherever they are; everything else outside the alphabet, a
    missing padding or data after it is an error there and here."""
    assert kubeconfig.pem(data, "f", "certificate-authority-data", "CERTIFICATE").startswith(PEM.decode())


@pytest.mark.parametrize(
    "data",
    [
        base64.b64encode(PEM).decode().replace("tL", "tL "),  # a space
        base64.b64encode(PEM).decode().replace("tL", "tL\t"),
        base64.b64encode(PEM + b"xy").decode().rstrip("="),  # padding missing
        base64.b64encode(PEM + b"xy").decode() + "AAAA",  # data after the padding
    ],
    ids=["space", "tab", "unpadded", "after-padding"],
)
def test_base64_that_go_refuses_is_refused(data: str) -> None:
    with pytest.raises(KubeconfigError, match="certificate-authority-data is not base64 of a PEM"):
        kubeconfig.pem(data, "f", "certificate-authority-data", "CERTIFICATE")


async def test_a_secrets_credentials_wrapped_at_76_columns_reach_the_server(
    kapi: tuple[int, dict[str, Any]],
) -> None:
    """A Secret whose kubeconfig was written with ``base64`` (wrapped): 0.2.0 and client-go read
    it, a strict decoder left the shoot without a target after an upgrade."""
    _, config = kapi
    user, cluster = config["users"][0]["user"], config["clusters"][0]["cluster"]
    for fields, key in (
        (user, "client-certificate-data"),
        (user, "client-key-data"),
        (cluster, "certificate-authority-data"),
    ):
        fields[key] = wrapped(base64.b64decode(fields[key]))
    endpoint = load_kubeconfig_dict(config, "secret shoot--p--a/access", data_only=True)
    assert await answer(endpoint) == {"cn": "dwd-lease-aggregator"}

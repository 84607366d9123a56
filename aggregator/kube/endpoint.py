"""Where an API server is and how to authenticate to it (``Endpoint``), from a kubeconfig file,
a Secret's kubeconfig, or the pod's own service account.

The aggregator's own kubeconfig file is read with the ``kubernetes`` package (that is all it
is used for): a client certificate, a token, a ``tokenFile`` (re-read when it changes, like
the in-cluster token) or an exec plugin (run again by the package's own refresh hook before its
token expires); ``auth-provider`` is refused by name. A kubeconfig from a Secret
(``data_only``) holds credentials as data only and is read by core/kubeconfig.py, which runs
no command, reads no file and follows no proxy. The kubeconfig itself is re-loaded when its
file changes, so rotated credentials keep working.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from core import kubeconfig
from core.credentials import TokenFile
from core.errors import KubeconfigError, unreadable
from core.files import Reloaded

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Endpoint:
    """Where an API server is and how to authenticate to it."""

    server: str
    ssl_context: ssl.SSLContext
    token: Callable[[], str | None]
    source: str
    # The name the server's certificate is checked against where it is not the server's host
    # (the kubeconfig's ``tls-server-name``).
    server_name: str = ""

    def headers(self) -> dict[str, str]:
        token = self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}


def load_kubeconfig(path: str | os.PathLike[str]) -> Endpoint:
    """An Endpoint from a kubeconfig file (current context), with clear errors that name the file."""
    path = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise KubeconfigError(f"kubeconfig {path}: {unreadable(e)}") from e
    return load_kubeconfig_dict(raw, path)


# What a kubeconfig from a Secret may hold: credentials and where to use them, as data. Whoever
# can write the Secret must not choose an action of this pod: a command (exec, auth-provider), a
# local file read and sent on (tokenFile: the pod's own seed token to any server), a proxy.
DATA_USER_FIELDS = frozenset({"token", "client-certificate-data", "client-key-data"})
DATA_CLUSTER_FIELDS = frozenset(
    {"server", "certificate-authority-data", "tls-server-name", "insecure-skip-tls-verify"}
)


def load_kubeconfig_dict(raw: Any, source: str, *, data_only: bool = False) -> Endpoint:
    """An Endpoint from a parsed kubeconfig; ``source`` names it in every error. ``data_only``
    (a kubeconfig from a Secret): any field beyond credentials as data is refused, by name,
    before the loader sees it."""
    if not isinstance(raw, dict):
        raise KubeconfigError(f"kubeconfig {source}: not a kubeconfig (expected a mapping)")
    if data_only:
        return _from_data(raw, source)
    if provider := _current_user(raw).get("auth-provider"):
        name = provider.get("name") if isinstance(provider, dict) else provider
        raise KubeconfigError(
            f"kubeconfig {source}: auth-provider {name!r} is not supported (client-go removed auth "
            "providers; use an exec plugin, a token, a tokenFile or a client certificate)"
        )
    cfg = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
            config_dict=raw, client_configuration=cfg, persist_config=False
        )
    except Exception as e:  # the loader raises anything from ConfigException to KeyError
        raise KubeconfigError(f"kubeconfig {source}: {e}") from e
    if not cfg.host or not str(cfg.host).startswith("https://"):
        raise KubeconfigError(f"kubeconfig {source}: server {cfg.host!r} is not an https URL")
    if not cfg.verify_ssl:
        raise KubeconfigError(f"kubeconfig {source}: insecure-skip-tls-verify is not allowed")
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.cert_file and cfg.key_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (OSError, ssl.SSLError) as e:
        raise KubeconfigError(f"kubeconfig {source}: bad certificate data: {e}") from e
    user = _current_user(raw)
    token: Callable[[], str | None]
    if user.get("tokenFile"):
        token = TokenFile(str(user["tokenFile"])).read
    elif "exec" in user:
        token = _exec_token(cfg, source)
    elif bearer := _bearer(cfg):
        token = lambda: bearer  # noqa: E731
    elif cfg.cert_file:
        token = lambda: None  # noqa: E731
    else:
        raise KubeconfigError(
            f"kubeconfig {source}: the current user has no token, tokenFile, exec plugin "
            "or client certificate"
        )
    server_name = str(getattr(cfg, "tls_server_name", None) or "")
    return Endpoint(str(cfg.host).rstrip("/"), ctx, token, source, server_name)


@dataclass(frozen=True)
class DataKubeconfig:
    """What a kubeconfig from a Secret says, decoded: the server, how to verify it, and the
    credentials as data ("" where absent)."""

    server: str
    ca_pem: str
    server_name: str
    token: str
    cert_pem: str
    key_pem: str


def read_data_kubeconfig(raw: Mapping[str, Any], source: str) -> DataKubeconfig:
    """core/kubeconfig.py's reader, no loader that could run what the Secret's writer chose;
    what client-go would read otherwise, but what this reader refuses by name (docs/settings.md)."""
    where = f"kubeconfig {source}"
    kubeconfig.only_data(raw, where, DATA_USER_FIELDS, DATA_CLUSTER_FIELDS)
    context = kubeconfig.current(raw, where)
    server, cluster, user = context.server, context.cluster, context.user
    if not server.startswith("https://"):
        raise KubeconfigError(f"{where}: server {server!r} is not an https URL")
    if cluster.get("insecure-skip-tls-verify"):
        raise KubeconfigError(f"{where}: insecure-skip-tls-verify is not allowed")
    cert, key = str(user.get("client-certificate-data") or ""), str(user.get("client-key-data") or "")
    if (cert or key) and not (cert and key):
        raise KubeconfigError(f"{where}: client-certificate-data and client-key-data go together")
    token = str(user.get("token") or "")
    if not token and not cert:
        raise KubeconfigError(f"{where}: the current user has no token or client certificate")
    return DataKubeconfig(
        server,
        context.ca_pem(),
        context.server_name,
        token,
        cert and kubeconfig.pem(cert, where, "client-certificate-data", "CERTIFICATE"),
        key and kubeconfig.pem(key, where, "client-key-data", "PRIVATE KEY"),
    )


def _from_data(raw: Mapping[str, Any], source: str) -> Endpoint:
    """An Endpoint from a kubeconfig that carries its credentials as data (from a Secret)."""
    data = read_data_kubeconfig(raw, source)
    ctx = ssl.create_default_context(cadata=data.ca_pem or None)
    if data.cert_pem:
        _load_pair(ctx, data.cert_pem, data.key_pem, f"kubeconfig {source}")
    token = data.token
    credentials: Callable[[], str | None] = lambda: token or None  # noqa: E731
    return Endpoint(data.server, ctx, credentials, source, data.server_name)


def _load_pair(ctx: ssl.SSLContext, cert_pem: str, key_pem: str, where: str) -> None:
    """A client certificate and key given as data: ssl reads them only from files, so they are
    written to a private directory for the moment it takes, and gone with it."""
    with tempfile.TemporaryDirectory(prefix="dwd-client-") as private:
        cert_path, key_path = Path(private, "tls.crt"), Path(private, "tls.key")
        cert_path.write_text(cert_pem)
        key_path.write_text(key_pem)
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as e:
            raise KubeconfigError(f"{where}: bad certificate data: {e}") from e


def _bearer(cfg: k8s_client.Configuration) -> str:
    value = (cfg.api_key or {}).get("BearerToken") or (cfg.api_key or {}).get("authorization") or ""
    return str(value).removeprefix("Bearer ").strip()


def _exec_token(cfg: k8s_client.Configuration, source: str) -> Callable[[], str | None]:
    """The exec plugin's token, renewed by the kubernetes loader's own hook: it runs the plugin
    again once the token is within five minutes of its ``expirationTimestamp``. The plugin
    runs inside the event loop: a plugin that takes seconds is a stall, which the decider
    treats as a gap in its view (judging nothing), never as stale leases."""
    if not _bearer(cfg):
        raise KubeconfigError(
            f"kubeconfig {source}: the exec plugin gave no token (client certificates from an exec "
            "plugin are not supported: put them into the kubeconfig)"
        )
    refresh: Callable[[Any], None] | None = cfg.refresh_api_key_hook

    def token() -> str | None:
        # A plugin that fails is logged by the loader and leaves the last token in place: the
        # API server's 401 then says it expired.
        if refresh is not None:
            refresh(cfg)
        return _bearer(cfg) or None

    return token


def _current_user(raw: dict[str, Any]) -> dict[str, Any]:
    """The current context's user entry: what the loader does not handle is decided on it."""
    current = raw.get("current-context")
    contexts = {c.get("name"): c.get("context") or {} for c in raw.get("contexts") or []}
    user_name = contexts.get(current, {}).get("user")
    for u in raw.get("users") or []:
        if u.get("name") == user_name:
            return dict(u.get("user") or {})
    return {}


def in_cluster(env: Mapping[str, str] = os.environ, directory: Path = IN_CLUSTER_DIR) -> Endpoint:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError("in-cluster config: KUBERNETES_SERVICE_HOST/PORT are not set")
    ca = directory / "ca.crt"
    if not ca.exists():
        raise KubeconfigError(f"in-cluster config: {ca} is missing")
    host = f"[{host}]" if ":" in host else host
    return Endpoint(
        f"https://{host}:{port}",
        ssl.create_default_context(cafile=str(ca)),
        TokenFile(directory / "token").read,
        "in-cluster",
    )


class KubeconfigSource(Reloaded[Endpoint]):
    """Loads an Endpoint from a file and again whenever the file changes."""

    def __init__(self, path: str) -> None:
        super().__init__(path, load_kubeconfig, lambda e: KubeconfigError(f"kubeconfig {path}: {e.strerror}"))

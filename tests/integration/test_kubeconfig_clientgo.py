"""Our two kubeconfig readers side by side with client-go itself (the pinned release, built by
testenv/base/kubeconfig_probe.py), over a corpus of variants: the agent's (the kubelet's file, loaded
by client-go as the kubelet loads it) and the aggregator's Secret reader (the same bytes, loaded by
client-go as a Secret's kubeconfig is). Where both read a file they must agree on the server, the
CA, the server name and (from a Secret) the credentials; where client-go reads one and ours
refuses, the refusal must be one of the named ones below, which docs/agent.md and
docs/settings.md list. Any other difference fails."""

from __future__ import annotations

import base64
import json
import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import pytest
import yaml

from agent.origin import Origin
from agent.settings import Settings
from aggregator.kube.endpoint import (
    DATA_CLUSTER_FIELDS,
    DATA_USER_FIELDS,
    load_kubeconfig_dict,
    read_data_kubeconfig,
)
from core.config import ConfigError
from core.errors import KubeconfigError
from testenv.base import kubeconfig_probe
from testenv.base.pki import CertificateAuthority

# Built by `make testenv` (its first part), or here on demand from the module cache.
pytestmark = [pytest.mark.integration, pytest.mark.builds(kubeconfig_probe.PROBE.module_dir.name)]

ROOT = Path(__file__).resolve().parents[2]
Reader = Literal["agent", "secret"]
Doc = Mapping[str, Any]


@dataclass(frozen=True)
class Refusal:
    """A kubeconfig client-go reads and ours refuses on purpose: what our error says, and what
    must be true of the file (or of client-go's reading of it) for that refusal to apply."""

    says: str
    applies: Callable[[Doc, dict[str, Any]], bool]


def _users(doc: Doc) -> list[Mapping[str, Any]]:
    return [e.get("user") or {} for e in doc.get("users") or []]


def _embeds(doc: Doc, go: dict[str, Any]) -> bool:
    return any(u.get(k) for u in _users(doc) for k in ("client-key-data", "token", "password"))


def _beyond_data(doc: Doc, go: dict[str, Any]) -> bool:
    clusters = [e.get("cluster") or {} for e in doc.get("clusters") or []]
    return any(set(u) - DATA_USER_FIELDS for u in _users(doc)) or any(
        set(c) - DATA_CLUSTER_FIELDS for c in clusters
    )


def _not_https(doc: Doc, go: dict[str, Any]) -> bool:
    return not str(go["host"]).startswith("https://")


def _not_a_ca(doc: Doc, go: dict[str, Any]) -> bool:
    """client-go takes any bytes and fails at its first connection; ours at once."""
    return "-----BEGIN CERTIFICATE-----" not in go["caData"]


REFUSALS: dict[Reader, dict[str, Refusal]] = {
    "agent": {
        "embedded-credentials": Refusal("embeds credentials", _embeds),
        "insecure-skip-tls-verify": Refusal("insecure-skip-tls-verify is set", lambda d, go: go["insecure"]),
        "proxy-url": Refusal("proxy-url is set", lambda d, go: go["proxy"]),
        "server-path": Refusal("has a path", lambda d, go: urlsplit(go["host"]).path not in ("", "/")),
        "not-https": Refusal("is not an https URL", _not_https),
        "ca-not-a-certificate": Refusal("holds no PEM certificate", _not_a_ca),
    },
    "secret": {
        "not-data": Refusal("not allowed in a kubeconfig from a Secret", _beyond_data),
        "insecure-skip-tls-verify": Refusal(
            "insecure-skip-tls-verify is not allowed", lambda d, go: go["insecure"]
        ),
        "no-credentials": Refusal(
            "has no token or client certificate", lambda d, go: not go["bearerToken"] and not go["certData"]
        ),
        "not-https": Refusal("is not an https URL", _not_https),
        "ca-not-a-certificate": Refusal("holds no PEM certificate", _not_a_ca),
    },
}


def _current_user(doc: Doc) -> str:
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or []}
    return str(contexts.get(doc.get("current-context"), {}).get("user"))


# The one way ours is more lenient than client-go: the agent reads the cluster only and never
# authenticates as the kubelet, so a user client-go finds unusable (a certificate without its key)
# is not its concern. client-go's every complaint about a user ends "for <the user's name>".
LENIENCIES: dict[Reader, dict[str, Callable[[Doc, str], bool]]] = {
    "agent": {"user-not-read": lambda doc, error: f" for {_current_user(doc)}" in error},
    "secret": {},
}


@dataclass(frozen=True)
class Files:
    """Real PEMs and files for the corpus: a CA, a client certificate and key, a token file."""

    dir: Path
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def b64(self, what: bytes) -> str:
        return base64.b64encode(what).decode()

    def wrapped(self, what: bytes, newline: str = "\n") -> str:
        flat = self.b64(what)
        return newline.join(flat[i : i + 76] for i in range(0, len(flat), 76)) + newline

    def kubelet_user(self) -> dict[str, str]:
        return {
            "client-certificate": str(self.dir / "client.crt"),
            "client-key": str(self.dir / "client.key"),
        }

    def secret_user(self) -> dict[str, str]:
        return {"client-certificate-data": self.b64(self.cert_pem), "client-key-data": self.b64(self.key_pem)}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    d = tmp_path_factory.mktemp("kubeconfigs")
    ca = CertificateAuthority(d, "corpus-ca")
    pair = ca.issue("client", "system:node:n1", organizations=["system:nodes"])
    (d / "client.crt").write_bytes(pair.cert.read_bytes())
    (d / "client.key").write_bytes(pair.key.read_bytes())
    (d / "ca.crt").write_bytes(ca.cert_path.read_bytes())
    (d / "token").write_text("file-t0ken")
    return Files(d, ca.cert_path.read_bytes(), pair.cert.read_bytes(), pair.key.read_bytes())


def config(cluster: Mapping[str, Any], user: Mapping[str, Any] | None, **top: Any) -> dict[str, Any]:
    """One cluster, one user, one context naming both (``top`` replaces any of it)."""
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "clusters": [{"name": "k", "cluster": dict(cluster)}],
        "contexts": [{"name": "ctx", "context": {"cluster": "k", "user": "u"}}],
        "users": [] if user is None else [{"name": "u", "user": dict(user)}],
    }
    return {**doc, **top}


SERVER = "https://api.internal.shoot.example"


def _block(server: str, ca: str, user: Mapping[str, Any], indicator: str = "|") -> str:
    """A kubeconfig as YAML text whose CA is a block of lines: ``|`` keeps its line ends (as a
    ``base64`` output pasted under it), ``""`` makes them a plain scalar, which YAML folds into
    spaces."""
    lines = "".join(f"        {line}\n" for line in ca.splitlines())
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: k\n  cluster:\n"
        f"    server: {server}\n    certificate-authority-data: {indicator}\n{lines}"
        "contexts:\n- name: ctx\n  context: {cluster: k, user: u}\n"
        f"users:\n- name: u\n  user: {json.dumps(dict(user))}\n"
    )


def cluster_variants(f: Files) -> dict[str, Callable[[Mapping[str, Any]], dict[str, Any] | str]]:
    """Variants of the cluster, each written once with the kubelet's user (for the agent) and
    once with credentials as data (for the Secret reader)."""
    ca, wrapped = f.b64(f.ca_pem), f.wrapped(f.ca_pem)
    unpadded = f.b64(f.ca_pem + b"xy").rstrip("=")

    def cluster(**fields: Any) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
        return lambda user: config({"server": SERVER, **fields}, user)

    return {
        "ca-data": cluster(**{"certificate-authority-data": ca}),
        "ca-data-wrapped-76-literal-block": lambda user: _block(SERVER, wrapped, user),
        "ca-data-wrapped-76-json": cluster(**{"certificate-authority-data": wrapped}),
        "ca-data-wrapped-crlf": cluster(**{"certificate-authority-data": f.wrapped(f.ca_pem, "\r\n")}),
        "ca-data-wrapped-folded-to-spaces": lambda user: _block(SERVER, wrapped, user, ""),
        "ca-data-padded-wrapped": cluster(**{"certificate-authority-data": f.wrapped(f.ca_pem + b"xy")}),
        "ca-data-unpadded": cluster(**{"certificate-authority-data": unpadded}),
        "ca-data-with-a-space": cluster(**{"certificate-authority-data": ca[:40] + " " + ca[40:]}),
        "ca-data-not-a-certificate": cluster(**{"certificate-authority-data": f.b64(b"hello")}),
        "tls-server-name": lambda user: config(
            {"server": "https://10.250.0.1", "certificate-authority-data": ca, "tls-server-name": "api.x"},
            user,
        ),
        "ipv6": cluster(server="https://[::1]:6443", **{"certificate-authority-data": ca}),
        "ipv6-tls-server-name": cluster(server="https://[fd00::1]", **{"tls-server-name": "api.x"}),
        "insecure-skip-tls-verify": cluster(**{"insecure-skip-tls-verify": True}),
        "insecure-false-with-ca": cluster(
            **{"insecure-skip-tls-verify": False, "certificate-authority-data": ca}
        ),
        "server-trailing-slash": cluster(server=SERVER + ":6443/"),
        "server-path-prefix": cluster(server=SERVER + "/k8s/clusters/c-1"),
        "server-http": cluster(server="http://api.internal.shoot.example"),
        "no-ca-system-store": cluster(),
        "ca-file-relative": cluster(**{"certificate-authority": "ca.crt"}),
        "ca-file-absolute": cluster(**{"certificate-authority": str(f.dir / "ca.crt")}),
        "ca-file-and-data": cluster(**{"certificate-authority": "ca.crt", "certificate-authority-data": ca}),
        "proxy-url": cluster(**{"proxy-url": "http://proxy.example:3128"}),
    }


def context_variants(f: Files, user: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Several contexts, clusters and users, and which of them the file names current."""
    clusters = [
        {"name": "a", "cluster": {"server": "https://a.example"}},
        {"name": "b", "cluster": {"server": "https://b.example:6443", "tls-server-name": "b.internal"}},
    ]
    users = [{"name": "ua", "user": dict(user)}, {"name": "ub", "user": dict(user)}]
    contexts = [
        {"name": "first", "context": {"cluster": "a", "user": "ua"}},
        {"name": "second", "context": {"cluster": "b", "user": "ub", "namespace": "kube-system"}},
        {"name": "nobody", "context": {"cluster": "b", "user": "missing"}},
        {"name": "nowhere", "context": {"cluster": "missing", "user": "ua"}},
    ]
    many = {"clusters": clusters, "users": users, "contexts": contexts}
    one = config({"server": SERVER}, user)
    return {
        "contexts-current-first": {**many, "current-context": "first"},
        "contexts-current-second": {**many, "current-context": "second"},
        "contexts-user-missing": {**many, "current-context": "nobody"},
        "contexts-cluster-missing": {**many, "current-context": "nowhere"},
        "contexts-current-not-there": {**many, "current-context": "third"},
        "contexts-no-current": many,
        "one-cluster-no-current-context": {k: v for k, v in one.items() if k != "current-context"},
        "one-cluster-empty-current-context": {**one, "current-context": ""},
        "no-users-at-all": config({"server": SERVER}, None),
    }


def user_variants(f: Files) -> dict[str, dict[str, Any]]:
    """Each kind of user, the same file for both readers."""
    exec_plugin = {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}
    cluster = {"server": SERVER, "certificate-authority-data": f.b64(f.ca_pem)}
    users: dict[str, dict[str, Any]] = {
        "user-token": {"token": "t0ken"},
        "user-token-file": {"tokenFile": str(f.dir / "token")},
        "user-cert-data": f.secret_user(),
        "user-cert-data-wrapped": {
            "client-certificate-data": f.wrapped(f.cert_pem),
            "client-key-data": f.wrapped(f.key_pem, "\r\n"),
        },
        "user-cert-data-without-key": {"client-certificate-data": f.b64(f.cert_pem)},
        "user-cert-files": f.kubelet_user(),
        "user-token-and-cert-data": {"token": "t0ken", **f.secret_user()},
        "user-exec": {"exec": {**exec_plugin, "interactiveMode": "Never"}},
        "user-auth-provider": {"auth-provider": {"name": "oidc", "config": {"idp-issuer-url": "https://i"}}},
        "user-basic-auth": {"username": "admin", "password": "secret"},
        "user-empty": {},
    }
    out = {name: config(cluster, user) for name, user in users.items()}
    unused = config(cluster, f.kubelet_user())
    unused["users"].append({"name": "other", "user": {"token": "t0ken"}})
    return {**out, "unused-user-embeds-a-token": unused}


@dataclass(frozen=True)
class Case:
    name: str
    reader: Reader
    path: Path


def write(path: Path, content: dict[str, Any] | str) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def corpus(f: Files) -> list[Case]:
    """Every variant as the agent would read it and as the Secret reader would."""
    users: dict[Reader, dict[str, str]] = {"agent": f.kubelet_user(), "secret": f.secret_user()}
    cases = []
    for reader, user in users.items():
        for name, make in cluster_variants(f).items():
            cases.append(Case(name, reader, write(f.dir / f"{reader}-{name}.yaml", make(user))))
        for name, doc in context_variants(f, user).items():
            cases.append(Case(name, reader, write(f.dir / f"{reader}-{name}.yaml", doc)))
    for name, doc in user_variants(f).items():
        path = write(f.dir / f"{name}.yaml", doc)
        cases += [Case(name, "agent", path), Case(name, "secret", path)]
    return cases


def ours_agent(case: Case, f: Files) -> dict[str, Any] | str:
    """What the agent starts with (or the problem it stops on), from the kubelet's kubeconfig:
    the server as it dials it (the host and port, no path), never through a proxy, verified."""
    env = {
        "NODE_NAME": "n1",
        "DWD_TOKEN_FILE": str(f.dir / "token"),
        "DWD_KUBELET_KUBECONFIG": str(case.path),
    }
    try:
        s = Settings.from_env(env)
    except ConfigError as e:
        return str(e)
    origin = Origin.from_url(s.apiserver_url)
    view = {"server": f"https://{origin.host_header}", "ca_data": s.ca_pem, "server_name": s.server_name}
    return {**view, "ca_file": s.ca_file, "proxy": False, "insecure": False}


def ours_secret(case: Case) -> dict[str, Any] | str:
    """What the aggregator takes from a Secret holding the file (as SecretKubeconfig.update reads
    it), or why it refuses."""
    try:
        raw = yaml.safe_load(case.path.read_bytes())
        load_kubeconfig_dict(raw, "corpus", data_only=True)
        d = read_data_kubeconfig(raw, "corpus")
    except (KubeconfigError, yaml.YAMLError) as e:
        return str(e)
    view = {"server": d.server, "ca_data": d.ca_pem, "server_name": d.server_name, "proxy": False}
    return {**view, "insecure": False, "token": d.token, "cert": d.cert_pem, "key": d.key_pem}


def go_view(reader: Reader, go: dict[str, Any]) -> dict[str, Any] | str:
    """client-go's reading in the terms of ours: a trailing slash of the server is no difference
    (a request path is appended either way), nor is how a CA file's path is spelled."""
    if go.get("error"):
        return str(go["error"])
    view = {"server": str(go["host"]).rstrip("/"), "ca_data": go["caData"], "server_name": go["serverName"]}
    view |= {"proxy": go["proxy"], "insecure": go["insecure"]}
    if reader == "agent":
        return {**view, "ca_file": go["caFile"]}
    return {**view, "token": go["bearerToken"], "cert": go["certData"], "key": go["keyData"]}


def normal(view: dict[str, Any] | str) -> dict[str, Any] | str:
    if isinstance(view, dict) and view.get("ca_file"):
        return {**view, "ca_file": os.path.normpath(view["ca_file"])}
    return view


def verdict(case: Case, go: dict[str, Any], ours: dict[str, Any] | str) -> str:
    """The name of what explains a difference: a documented refusal or leniency; "agree",
    "both-refuse", or "DIFFERENT: ..." with both sides."""
    theirs, ours = normal(go_view(case.reader, go)), normal(ours)
    if isinstance(theirs, str) and isinstance(ours, str):
        return "both-refuse"
    if theirs == ours:
        return "agree"
    doc = yaml.safe_load(case.path.read_text())
    if isinstance(ours, str):
        for name, refusal in REFUSALS[case.reader].items():
            if refusal.says in ours and refusal.applies(doc, go):
                return name
    elif isinstance(theirs, str):
        for name, applies in LENIENCIES[case.reader].items():
            if applies(doc, theirs):
                return name
    return f"DIFFERENT: client-go {theirs!r}, ours {ours!r}"


@pytest.fixture(scope="module")
def verdicts(files: Files) -> dict[tuple[str, Reader], str]:
    cases = corpus(files)
    modes: dict[Reader, kubeconfig_probe.Mode] = {"agent": "file", "secret": "bytes"}
    answers = kubeconfig_probe.load([(modes[c.reader], c.path) for c in cases])
    out = {}
    for case, go in zip(cases, answers, strict=True):
        ours = ours_agent(case, files) if case.reader == "agent" else ours_secret(case)
        out[(case.name, case.reader)] = verdict(case, go, ours)
    return out


def test_both_readers_read_every_kubeconfig_as_client_go_does_or_refuse_it_by_name(
    verdicts: dict[tuple[str, Reader], str],
) -> None:
    different = {k: v for k, v in verdicts.items() if v.startswith("DIFFERENT")}
    counts = Counter(v.split(":")[0] for v in verdicts.values())
    files = len({name for name, _ in verdicts})
    print(
        f"\nkubeconfig corpus: {files} variants, {len(verdicts)} readings, "
        f"{len(different)} differences; {dict(sorted(counts.items()))}"
    )
    print(*(f"{name} ({reader}): {v}" for (name, reader), v in different.items()), sep="\n")
    assert different == {}
    # Not a corpus that every reader refuses: each reads most of it as client-go does.
    for reader in ("agent", "secret"):
        agreed = [n for (n, r), v in verdicts.items() if r == reader and v == "agree"]
        assert len(agreed) >= 15, (reader, agreed)


@pytest.mark.parametrize(
    ("name", "reader", "expected"),
    [
        ("ca-data-wrapped-76-literal-block", "agent", "agree"),
        ("ca-data-wrapped-crlf", "secret", "agree"),
        ("user-cert-data-wrapped", "secret", "agree"),
        ("tls-server-name", "agent", "agree"),
        ("tls-server-name", "secret", "agree"),
        ("ipv6-tls-server-name", "agent", "agree"),
        ("contexts-current-second", "agent", "agree"),
        ("ca-data-wrapped-folded-to-spaces", "agent", "both-refuse"),
        ("insecure-skip-tls-verify", "agent", "insecure-skip-tls-verify"),
        ("user-exec", "secret", "not-data"),
    ],
)
def test_the_classes_of_issue_56_are_read_as_client_go_reads_them(
    verdicts: dict[tuple[str, Reader], str], name: str, reader: Reader, expected: str
) -> None:
    assert verdicts[(name, reader)] == expected


def test_every_refusal_is_named_in_the_docs() -> None:
    docs = {
        "agent": (ROOT / "docs" / "agent.md").read_text(),
        "secret": (ROOT / "docs" / "settings.md").read_text(),
    }
    named = {r: [*REFUSALS[r], *LENIENCIES[r]] for r in REFUSALS}
    missing = [f"{r}: {n}" for r, names in named.items() for n in names if f"`{n}`" not in docs[r]]
    assert missing == []

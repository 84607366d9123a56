"""Where the agent connects and how it trusts what answers: the server's origin as the agent
dials it, and the TLS context. Settings reads them (agent/settings.py) and the path uses them
(agent/path.py), each from here: the settings do not sit above the network code."""

from __future__ import annotations

import ssl
from dataclasses import dataclass


def wire_name(host: str) -> bytes | str:
    """A host name as the resolver and TLS take it. An ASCII name goes as bytes, which both take
    as they are; a str goes through the idna codec, and loading it (with unicodedata) costs
    0.5 MiB. A name that is not ASCII still needs it."""
    return host.encode() if host.isascii() else host


def ssl_context(ca_file: str = "", *, ca_pem: str = "") -> ssl.SSLContext:
    """Verify against the CA file or PEM, or the system store when neither is given."""
    ctx = ssl.create_default_context(cafile=ca_file or None, cadata=ca_pem or None)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


@dataclass(frozen=True)
class Origin:
    """The external name as the agent dials it: host for DNS, TLS and the Host header."""

    host: str
    port: int
    # The name the server's certificate is checked against and sent as SNI where it is not the
    # host (the kubelet kubeconfig's ``tls-server-name``): the Host header stays the host's, as
    # client-go sends it.
    tls_name: str = ""

    @classmethod
    def from_url(cls, url: str) -> Origin:
        """The host and port of an https URL; a path is allowed (and not used), a user, a query or
        a fragment is not. Parsed here: urllib.parse loads ipaddress, 0.4 MiB on every node."""
        scheme, sep, rest = url.partition("://")
        end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
        authority, tail = rest[:end], rest[end:]
        if scheme.lower() != "https" or not sep or "@" in authority:
            raise ValueError("is not an https URL with a host name")
        if "?" in tail or "#" in tail:
            raise ValueError("must not carry a query or fragment")
        if authority.startswith("["):  # an IPv6 address: [::1]:6443
            host, _, after = authority[1:].partition("]")
            port = after.removeprefix(":") if after.startswith(":") or not after else None
        else:
            host, _, port = authority.partition(":")
        if not host or port is None or ":" in port:
            raise ValueError("is not an https URL with a host name")
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"has no valid port ({port!r})")
        return cls(host.lower(), int(port) if port else 443)

    @property
    def server_name(self) -> bytes | str:
        """The TLS server name (``wire_name``)."""
        return wire_name(self.tls_name or self.host)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 443 else f"{host}:{self.port}"

"""How ``edgekit serve`` runs (``ServeConfig``) and the names it answers to: the bound
address, loopback names, host names and web origins allowed beyond them.

A config is checked when made (ServeError): no empty API key, and no address beyond
loopback without a key unless ``insecure_no_auth`` says so.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

from edgekit.errors import ServeError
from edgekit.untrusted import clean_text

LOOPBACK_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")
HOST_HEADER = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(\d{1,5}))?")
ORIGIN = re.compile(r"([a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::(\d{1,5}))?")
DEFAULT_PORTS = {"http": 80, "https": 443}
_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces: what a header can carry


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How the server runs. Checked when made (ServeError): no empty API key, and no
    address beyond loopback without a key unless ``insecure_no_auth`` says so."""

    model_name: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_request_bytes: int = 1 << 20
    max_tokens_limit: int = 4096
    queue_size: int = 8
    allow_hosts: tuple[str, ...] = ()  # Host names accepted beyond the bound address ("*": any)
    allow_origins: tuple[str, ...] = ()  # web origins that may call it ("*": any)
    insecure_no_auth: bool = False  # serve beyond loopback without an API key
    header_timeout: float = 30.0  # seconds a connection may take to send a request's headers
    body_timeout: float = 30.0  # seconds a client may take to send its request body
    send_timeout: float = 60.0  # seconds a client may leave a part of the answer unread

    def __post_init__(self) -> None:
        self._check_key()
        for name, value, low in (
            ("port", self.port, 0),
            ("max_request_bytes", self.max_request_bytes, 1),
            ("max_tokens_limit", self.max_tokens_limit, 1),
            ("queue_size", self.queue_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ServeError(f"{name} must be an integer of at least {low}, not {value!r}")
        if self.port > 65535:
            raise ServeError(f"port must be at most 65535, not {self.port}")
        for name, seconds in (
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("send_timeout", self.send_timeout),
        ):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                raise ServeError(f"{name} must be a number of seconds, not {seconds!r}")
            if not 0 < seconds < math.inf:  # NaN too: no deadline would ever pass
                raise ServeError(f"{name} must be a positive number of seconds, not {seconds!r}")
        object.__setattr__(self, "allow_hosts", tuple(_allowed_host(h) for h in self.allow_hosts))
        object.__setattr__(
            self, "allow_origins", tuple(_allowed_origin(o) for o in self.allow_origins)
        )

    def _check_key(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ServeError(
                "the API key is empty: every client would be let in",
                hint="pass a real key with --api-key (or $EDGEKIT_API_KEY), or leave it out "
                "to serve on loopback without one",
            )
        if self.api_key is not None and not _KEY.fullmatch(self.api_key):
            raise ServeError(
                "the API key must be printable ASCII without spaces (it travels in an HTTP header)",
                hint="make one with: python -c 'import secrets; print(secrets.token_urlsafe())'",
            )
        if self.api_key is None and not is_loopback(self.host) and not self.insecure_no_auth:
            raise ServeError(
                f"serving on {clean_text(self.host)} without an API key would let anyone who "
                f"can reach port {self.port} use the model",
                hint="pass --api-key KEY (or set $EDGEKIT_API_KEY), or --insecure-no-auth to "
                "serve without a key anyway",
            )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is reachable from this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser's ``Origin`` is the server itself, as the ``Host`` names it."""
    o = ORIGIN.fullmatch(origin)
    h = HOST_HEADER.fullmatch(host.lower())
    if o is None or h is None or o.group(1) not in DEFAULT_PORTS:
        return False
    o_port = int(o.group(3)) if o.group(3) else DEFAULT_PORTS[o.group(1)]
    h_port = int(h.group(2)) if h.group(2) else DEFAULT_PORTS[o.group(1)]
    return o.group(2) == h.group(1) and o_port == h_port


def _allowed_host(value: str) -> str:
    name = value.strip().lower().strip("[]")
    if name != "*" and not re.fullmatch(r"[a-z0-9.:-]+", name):
        raise ServeError(
            f"--allow-host {clean_text(value)!r} is not a host name",
            hint="pass a name such as mybox.lan, or * to accept any",
        )
    return name


def _allowed_origin(value: str) -> str:
    origin = value.strip().lower().rstrip("/")
    if origin not in ("*", "null") and not ORIGIN.fullmatch(origin):
        raise ServeError(
            f"--allow-origin {clean_text(value)!r} is not a web origin",
            hint="pass scheme://host[:port], such as http://localhost:3000, or * for any",
        )
    return origin

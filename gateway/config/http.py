"""The HTTP sections of the config: the listener's limits and TLS, a backend's limits and TLS,
its URL or replicas' URLs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gateway.config import keys
from gateway.config.listeners import ListenerLimits, ServerTls
from gateway.config.model import BALANCE_MODES, BackendLimits, ClientTls
from gateway.config.reader import _Check

Path_ = tuple[str, ...]

_URL = re.compile(r"^https?://")
# The keys that only mean something with several replicas' `urls` (Streamable HTTP only).
REPLICA_KEYS = ("urls", "balance", "eject_for")
LISTENER_LIMIT_KEYS = keys.names("listener_limits")
BACKEND_LIMIT_KEYS = keys.names("backend_limits")


def listener_limits(c: _Check, raw: Any, path: Path_, legacy_body: Any) -> ListenerLimits:
    """`listen.http.limits`; `listen.http.max_body_bytes` (older configs) is still read."""
    body = c.mapping(raw, path, LISTENER_LIMIT_KEYS)
    max_body = ListenerLimits().max_body_bytes
    if legacy_body is not None:
        max_body = c.count(legacy_body, path[:-1] + ("max_body_bytes",), max_body)
    max_body = c.count(body.get("max_body_bytes"), path + ("max_body_bytes",), max_body)
    values = c.scalars(body, path, ListenerLimits, skip={"max_body_bytes"})
    return ListenerLimits(max_body_bytes=max_body, **values)


def backend_limits(c: _Check, raw: Any, path: Path_) -> BackendLimits:
    body = c.mapping(raw, path, BACKEND_LIMIT_KEYS)
    return BackendLimits(**c.scalars(body, path, BackendLimits))


def _pem(c: _Check, raw: Any, path: Path_, base: Path, required: bool) -> str | None:
    value = c.string(raw, path)
    if not value:
        if required:
            c.r.problem(path, "is required")
        return None
    where = Path(value) if Path(value).is_absolute() else base / value
    if not where.is_file():
        c.r.problem(path, f"no such file: {where}")
    return str(where)


def server_tls(c: _Check, raw: Any, path: Path_, base: Path) -> ServerTls | None:
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("server_tls"))
    cert = _pem(c, body.get("cert_file"), path + ("cert_file",), base, True)
    key = _pem(c, body.get("key_file"), path + ("key_file",), base, True)
    return ServerTls(cert_file=cert or "", key_file=key or "")


def client_tls(c: _Check, raw: Any, path: Path_, base: Path) -> ClientTls:
    if raw is None:
        return ClientTls()
    body = c.mapping(raw, path, keys.names("client_tls"))
    cert = _pem(c, body.get("cert_file"), path + ("cert_file",), base, False)
    key = _pem(c, body.get("key_file"), path + ("key_file",), base, False)
    if key is not None and cert is None:
        c.r.problem(path + ("key_file",), "needs cert_file")
    return ClientTls(
        ca_file=_pem(c, body.get("ca_file"), path + ("ca_file",), base, False),
        cert_file=cert,
        key_file=key,
        verify=c.boolean(body.get("verify"), path + ("verify",), True),
    )


def urls(c: _Check, body: dict[str, Any], path: Path_, http: bool) -> tuple[str, dict[str, Any]]:
    """A backend's `url`, or (Streamable HTTP only) its replicas' `urls` with `balance` and
    `eject_for`: the first URL, and the HttpTarget fields of the replicas (none for sse)."""
    table = keys.table("http_target")
    if not http:
        for name in REPLICA_KEYS:
            if body.get(name) is not None:
                c.r.problem(path + (name,), "is for http backends only")
    listed = c.field(body, path, "urls", table["urls"]) if http else ()
    if http and body.get("url") is not None and body.get("urls") is not None:
        c.r.problem(path, "needs exactly one of url or urls")
        return "", {}
    if body.get("urls") is None or not http:
        url = c.field(body, path, "url", table["url"])
        if not url or not _URL.match(url):
            c.r.problem(path + ("url",), "must be an http:// or https:// URL")
        for name in REPLICA_KEYS[1:]:
            if http and body.get(name) is not None:
                c.r.problem(path + (name,), "only applies with urls")
        return url or "", {}
    if not listed:
        c.r.problem(path + ("urls",), "must list at least one URL")
    for at, each in enumerate(listed):
        if not _URL.match(each):
            c.r.problem(path + ("urls", str(at)), "must be an http:// or https:// URL")
    if len(set(listed)) != len(listed):
        c.r.problem(path + ("urls",), "lists a URL twice")
    balance = c.field(body, path, "balance", table["balance"])
    if balance not in BALANCE_MODES:
        c.r.problem(path + ("balance",), f"must be one of {', '.join(BALANCE_MODES)}")
    replicas = {
        "urls": listed,
        "balance": balance if balance in BALANCE_MODES else "round_robin",
        "eject_for": c.field(body, path, "eject_for", table["eject_for"]),
    }
    return listed[0] if listed else "", replicas

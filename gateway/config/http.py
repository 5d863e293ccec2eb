"""The HTTP sections of the config: the listener's limits and TLS, a backend's limits and TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config.model import (
    BackendLimits,
    ClientTls,
    ListenerLimits,
    ServerTls,
)
from gateway.config.reader import _Check

Path_ = tuple[str, ...]

LISTENER_LIMIT_KEYS = {
    "max_body_bytes",
    "max_header_bytes",
    "max_headers",
    "max_connections",
    "max_requests_per_connection",
    "idle_timeout",
    "header_timeout",
    "body_timeout",
}
BACKEND_LIMIT_KEYS = {
    "max_connections",
    "idle_timeout",
    "max_reply_bytes",
    "max_event_bytes",
    "max_header_bytes",
    "max_headers",
}


def listener_limits(c: _Check, raw: Any, path: Path_, legacy_body: Any) -> ListenerLimits:
    """`listen.http.limits`; `listen.http.max_body_bytes` (older configs) is still read."""
    body = c.mapping(raw, path, LISTENER_LIMIT_KEYS)
    d = ListenerLimits()
    max_body = d.max_body_bytes
    if legacy_body is not None:
        max_body = c.count(legacy_body, path[:-1] + ("max_body_bytes",), max_body)
    return ListenerLimits(
        max_body_bytes=c.count(body.get("max_body_bytes"), path + ("max_body_bytes",), max_body),
        max_header_bytes=c.count(
            body.get("max_header_bytes"), path + ("max_header_bytes",), d.max_header_bytes, 256
        ),
        max_headers=c.count(body.get("max_headers"), path + ("max_headers",), d.max_headers, 8),
        max_connections=c.count(
            body.get("max_connections"), path + ("max_connections",), d.max_connections
        ),
        max_requests_per_connection=c.count(
            body.get("max_requests_per_connection"),
            path + ("max_requests_per_connection",),
            d.max_requests_per_connection,
        ),
        idle_timeout=c.number(body.get("idle_timeout"), path + ("idle_timeout",), d.idle_timeout),
        header_timeout=c.number(
            body.get("header_timeout"), path + ("header_timeout",), d.header_timeout
        ),
        body_timeout=c.number(body.get("body_timeout"), path + ("body_timeout",), d.body_timeout),
    )


def backend_limits(c: _Check, raw: Any, path: Path_) -> BackendLimits:
    body = c.mapping(raw, path, BACKEND_LIMIT_KEYS)
    d = BackendLimits()
    return BackendLimits(
        max_connections=c.count(
            body.get("max_connections"), path + ("max_connections",), d.max_connections
        ),
        idle_timeout=c.number(body.get("idle_timeout"), path + ("idle_timeout",), d.idle_timeout),
        max_reply_bytes=c.count(
            body.get("max_reply_bytes"), path + ("max_reply_bytes",), d.max_reply_bytes
        ),
        max_event_bytes=c.count(
            body.get("max_event_bytes"), path + ("max_event_bytes",), d.max_event_bytes
        ),
        max_header_bytes=c.count(
            body.get("max_header_bytes"), path + ("max_header_bytes",), d.max_header_bytes, 256
        ),
        max_headers=c.count(body.get("max_headers"), path + ("max_headers",), d.max_headers, 8),
    )


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
    body = c.mapping(raw, path, {"cert_file", "key_file"})
    cert = _pem(c, body.get("cert_file"), path + ("cert_file",), base, True)
    key = _pem(c, body.get("key_file"), path + ("key_file",), base, True)
    return ServerTls(cert_file=cert or "", key_file=key or "")


def client_tls(c: _Check, raw: Any, path: Path_, base: Path) -> ClientTls:
    if raw is None:
        return ClientTls()
    body = c.mapping(raw, path, {"ca_file", "cert_file", "key_file", "verify"})
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

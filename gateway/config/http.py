"""The HTTP sections of the config: the listener's limits and TLS, a backend's limits and TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import keys
from gateway.config.model import (
    BackendLimits,
    ClientTls,
    ListenerLimits,
    ServerTls,
)
from gateway.config.reader import _Check

Path_ = tuple[str, ...]

LISTENER_LIMIT_KEYS = keys.names("listener_limits")
BACKEND_LIMIT_KEYS = keys.names("backend_limits")


def listener_limits(c: _Check, raw: Any, path: Path_, legacy_body: Any) -> ListenerLimits:
    """`listen.http.limits`; `listen.http.max_body_bytes` (older configs) is still read."""
    body = c.mapping(raw, path, LISTENER_LIMIT_KEYS)
    table = keys.table("listener_limits")
    max_body = ListenerLimits().max_body_bytes
    if legacy_body is not None:
        max_body = c.count(legacy_body, path[:-1] + ("max_body_bytes",), max_body)
    values: dict[str, Any] = {
        "max_body_bytes": c.count(body.get("max_body_bytes"), path + ("max_body_bytes",), max_body)
    }
    for name, key in table.items():
        if name != "max_body_bytes":
            values[name] = c.field(body, path, name, key)
    return ListenerLimits(**values)


def backend_limits(c: _Check, raw: Any, path: Path_) -> BackendLimits:
    body = c.mapping(raw, path, BACKEND_LIMIT_KEYS)
    table = keys.table("backend_limits")
    return BackendLimits(**{name: c.field(body, path, name, key) for name, key in table.items()})


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

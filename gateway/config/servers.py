"""The `servers:` section (virtual servers: config/virtual.py) and `namespacing:`, which a
virtual server may set for itself, read with line-numbered problems like the rest."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from gateway.config import keys, search_loader
from gateway.config import limits as limit_sections
from gateway.config import policy as policy_sections
from gateway.config.auth import url_problem
from gateway.config.key import NAME_PATTERN
from gateway.config.listeners import HttpListen
from gateway.config.model import PREFIX_MODES, BackendConfig, Namespacing
from gateway.config.reader import _Check
from gateway.config.virtual import MERGED_SERVER, ServerAuth, ServerBackend, ServerConfig

Path_ = tuple[str, ...]
# Paths the HTTP listener serves for itself: a virtual server never shadows them.
RESERVED_PATHS = ("/.well-known/", "/oauth/", "/metrics", "/healthz", "/readyz", "/status")
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


def namespacing(c: _Check, raw: Any, path: Path_ = ("namespacing",)) -> Namespacing:
    body = c.mapping(raw, path, keys.names("namespacing"))
    t = keys.table("namespacing")
    prefix = c.field(body, path, "prefix", t["prefix"]) or "auto"
    if prefix not in PREFIX_MODES:
        c.r.problem(path + ("prefix",), f"must be one of {', '.join(PREFIX_MODES)}")
    separator = c.field(body, path, "separator", t["separator"]) or "_"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,3}", separator):
        c.r.problem(path + ("separator",), "must be 1 to 3 of letters, digits, '_', '.', '-'")
    length = c.field(body, path, "max_name_length", t["max_name_length"])
    if not 16 <= length <= 128:
        c.r.problem(path + ("max_name_length",), "must be from 16 to 128")
    return Namespacing(prefix=prefix, separator=separator, max_name_length=int(length))


def servers(
    c: _Check,
    raw: Any,
    backends: Collection[BackendConfig],
    http: HttpListen | None,
    stdio: bool,
) -> tuple[ServerConfig, ...]:
    """`servers:`: each name a virtual server over the backends it names."""
    if raw is None:
        return ()
    found = c.mapping(raw, ("servers",))
    if found and http is None and not stdio:
        c.r.problem(("servers",), "needs listen.http or listen.stdio to be served on")
    known = {b.name for b in backends}
    out = [_server(c, name, body, known, http) for name, body in found.items()]
    paths: dict[str, str] = {}
    for server in out:
        where = ("servers", server.name, "path")
        if http is not None and server.path == http.path:
            c.r.problem(where, f"{server.path} is the merged server's (listen.http.path)")
        elif server.path in paths:
            c.r.problem(where, f"{server.path} is also {paths[server.path]}'s")
        paths[server.path] = server.name
    return tuple(out)


def _server(
    c: _Check, name: str, raw: Any, known: Collection[str], http: HttpListen | None
) -> ServerConfig:
    path: Path_ = ("servers", name)
    if not re.fullmatch(NAME_PATTERN, name):
        c.r.problem(path, "a server's name is letters, digits, '_', '.' and '-'")
    elif name == MERGED_SERVER:
        c.r.problem(path, f"{MERGED_SERVER!r} is the merged server's name (metrics, status page)")
    body = c.mapping(raw, path, keys.names("server"))
    t = keys.table("server")
    chosen = c.mapping(body.get("backends"), path + ("backends",))
    if not chosen:
        c.r.problem(path + ("backends",), "name at least one backend")
    selections = []
    for backend, selection in chosen.items():
        if backend not in known:
            names = ", ".join(sorted(known)) or "none"
            c.r.problem(path + ("backends", backend), f"no backend {backend!r} ({names})")
            continue
        selections.append(_selection(c, backend, selection, path + ("backends", backend)))
    url_path = c.field(body, path, "path", t["path"]) or _default_path(http, name)
    if not url_path.startswith("/"):
        c.r.problem(path + ("path",), "must start with /")
    elif any(url_path.startswith(r) for r in RESERVED_PATHS):
        c.r.problem(path + ("path",), "is a path the listener serves for itself")
    return ServerConfig(
        name=name,
        path=url_path,
        backends=tuple(selections),
        namespacing=(
            namespacing(c, body["namespacing"], path + ("namespacing",))
            if body.get("namespacing") is not None
            else None
        ),
        instructions=c.field(body, path, "instructions", t["instructions"]),
        server_name=c.field(body, path, "server_name", t["server_name"]) or name,
        tool_search=(
            search_loader.tool_search(c, body["tool_search"], path + ("tool_search",))
            if body.get("tool_search") is not None
            else None
        ),
        auth=_auth(c, body.get("auth"), path + ("auth",), http),
        policy=policy_sections.policy(c, body.get("policy"), known, path + ("policy",)),
        rate_limits=limit_sections.rate_limits(c, body.get("rate_limits"), path + ("rate_limits",)),
    )


def _default_path(http: HttpListen | None, name: str) -> str:
    base = http.path if http is not None else "/mcp"
    return f"{base.rstrip('/')}/{name}"


def _selection(c: _Check, backend: str, raw: Any, path: Path_) -> ServerBackend:
    body = c.mapping(raw, path, keys.names("server_backend"))
    t = keys.table("server_backend")
    # Absent: everything; a list (an empty one too): those only.
    lists = {
        kind: c.field(body, path, kind, t[kind]) if kind in body else None
        for kind in ("tools", "prompts", "resources")
    }
    if body.get("tools") is None and "tools" in body:
        lists["tools"] = ()  # (`tools:` with nothing after it: none, as `[]`)
    return ServerBackend(
        name=backend,
        tools=lists["tools"],
        prompts=lists["prompts"],
        resources=lists["resources"],
        rename=c.field(body, path, "rename", t["rename"]),
        namespace=c.field(body, path, "namespace", t["namespace"]) or "",
    )


def _auth(c: _Check, raw: Any, path: Path_, http: HttpListen | None) -> ServerAuth | None:
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("server_auth"))
    t = keys.table("server_auth")
    resource = c.field(body, path, "resource", t["resource"]) or ""
    if resource and (why := url_problem(resource, https=False)) is not None:
        c.r.problem(path + ("resource",), why)
    scopes: dict[str, tuple[str, ...]] = {}
    for name in ("scopes", "scopes_supported"):
        scopes[name] = c.field(body, path, name, t[name])
        for i, scope in enumerate(scopes[name]):
            if not _SCOPE.fullmatch(scope):
                c.r.problem(
                    path + (name, str(i)), "is not a scope token (visible ASCII, no quotes)"
                )
    if http is None:
        c.r.problem(path, "applies to listen.http, which is not configured")
    return ServerAuth(
        resource=resource,
        audience=c.field(body, path, "audience", t["audience"]) or "",
        scopes=scopes["scopes"],
        scopes_supported=scopes["scopes_supported"],
    )

"""One `backends:` entry -> a BackendConfig: its transport (stdio, http, sse), era, namespace,
exposure, isolation and timeouts; the sections of its own (auth, roots, retries, limits) are
read by their modules. Also the check across entries: names and namespaces are unique.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import backend_auth as backend_auth_section
from gateway.config import hook_loader, keys, pins_loader, resilience
from gateway.config import http as http_sections
from gateway.config import roots as root_sections
from gateway.config.model import (
    _NAME,
    ERAS,
    ISOLATIONS,
    BackendConfig,
    HttpTarget,
    SseTarget,
    StdioTarget,
    Target,
    default_connect_timeout,
)
from gateway.config.reader import _Check, _Reader


def backend(c: _Check, name: str, raw: Any, base: Path) -> BackendConfig | None:
    path = ("backends", name)
    if not _NAME.match(name):
        c.r.problem(path, "a backend name uses letters, digits, '_', '.' and '-'")
    body = c.mapping(raw, path, keys.names("backend"))
    t = keys.table("backend")
    kinds = [k for k in keys.TRANSPORTS if body.get(k) is not None]
    if len(kinds) != 1:
        c.r.problem(path, "needs exactly one of stdio, http or sse")
        return None
    target: Target
    if kinds[0] == "stdio":
        sp = path + ("stdio",)
        s = c.mapping(body["stdio"], sp, keys.names("stdio"))
        st = keys.table("stdio")
        command = c.field(s, sp, "command", st["command"])
        if not command:
            c.r.problem(sp + ("command",), "is required")
        target = StdioTarget(
            command=command or "",
            args=c.field(s, sp, "args", st["args"]),
            env=c.field(s, sp, "env", st["env"]),
            cwd=c.field(s, sp, "cwd", st["cwd"]),
            inherit_env=c.field(s, sp, "inherit_env", st["inherit_env"]),
        )
    else:
        hp = path + (kinds[0],)
        h = c.mapping(body[kinds[0]], hp, keys.names("http_target"))
        ht = keys.table("http_target")
        url, replicas = http_sections.urls(c, h, hp, kinds[0] == "http")
        kind = HttpTarget if kinds[0] == "http" else SseTarget
        target = kind(
            url=url,
            headers=c.field(h, hp, "headers", ht["headers"]),
            tls=http_sections.client_tls(c, h.get("tls"), hp + ("tls",), base),
            limits=http_sections.backend_limits(c, h.get("limits"), hp + ("limits",)),
            **replicas,
        )
    era = c.field(body, path, "era", t["era"]) or "auto"
    if era not in ERAS:
        c.r.problem(path + ("era",), f"must be one of {', '.join(ERAS)}")
    elif kinds[0] == "sse" and era == "modern":
        c.r.problem(path + ("era",), "an sse backend speaks a legacy version")
    namespace = c.field(body, path, "namespace", t["namespace"]) or ""
    if namespace and not _NAME.match(namespace):
        c.r.problem(path + ("namespace",), "a namespace uses letters, digits, '_', '.' and '-'")
    tools = c.mapping(body.get("tools"), path + ("tools",))  # (other keys: resilience.py)
    tt = keys.table("tools")
    isolation = _isolation(c, body, path, kinds[0])
    return BackendConfig(
        name=name,
        target=target,
        era="legacy" if kinds[0] == "sse" else era,
        legacy_lane=c.field(body, path, "legacy_lane", t["legacy_lane"]),
        namespace=namespace,
        allow_tools=c.field(tools, path + ("tools",), "allow", tt["allow"]),
        deny_tools=c.field(tools, path + ("tools",), "deny", tt["deny"]),
        rename_tools=c.field(body, path, "rename", t["rename"]),
        forward_unknown=c.field(body, path, "forward_unknown", t["forward_unknown"]),
        lists_from_catalog=c.field(body, path, "lists_from_catalog", t["lists_from_catalog"]),
        roots=root_sections.roots(c, body.get("roots"), path + ("roots",)),
        connect_timeout=c.number(
            body.get("connect_timeout"),
            path + ("connect_timeout",),
            default_connect_timeout(target),
        ),
        request_timeout=c.field(body, path, "request_timeout", t["request_timeout"]),
        start_timeout=c.field(body, path, "start_timeout", t["start_timeout"]),
        isolation=isolation,
        child_idle_timeout=c.field(body, path, "child_idle_timeout", t["child_idle_timeout"]),
        max_children=c.field(body, path, "max_children", t["max_children"]),
        max_in_flight=c.field(body, path, "max_in_flight", t["max_in_flight"]),
        auth=backend_auth_section.backend_auth(
            c, body.get("auth"), path + ("auth",), base, kinds[0]
        ),
        tool_timeouts=resilience.tool_timeouts(c, body.get("tools"), path + ("tools",)),
        retries=resilience.retries(c, body.get("retries"), path + ("retries",)),
        breaker=resilience.breaker(c, body.get("breaker"), path + ("breaker",)),
        pins=pins_loader.backend_pins(c, body.get("pins"), path + ("pins",)),
        hooks=hook_loader.hooks(c, body.get("hooks"), path + ("hooks",)),
    )


def _isolation(c: _Check, body: dict[str, Any], path: tuple[str, ...], kind: str) -> str:
    """`isolation` and the keys that only mean something under `per_session`, which only a
    stdio backend can have (an HTTP server keeps per-client state in its own sessions)."""
    isolation = c.field(body, path, "isolation", keys.table("backend")["isolation"]) or "shared"
    if isolation not in ISOLATIONS:
        c.r.problem(path + ("isolation",), f"must be one of {', '.join(ISOLATIONS)}")
        return "shared"
    if isolation == "per_session" and kind != "stdio":
        c.r.problem(path + ("isolation",), "per_session is for stdio backends only")
    if kind != "stdio" and body.get("start_timeout") is not None:
        c.r.problem(path + ("start_timeout",), "only applies to stdio backends")
    if isolation != "per_session":
        for key in ("child_idle_timeout", "max_children"):
            if body.get(key) is not None:
                c.r.problem(path + (key,), "only applies with isolation: per_session")
    return isolation


def check_names(reader: _Reader, backends: list[BackendConfig]) -> None:
    seen_names: dict[str, str] = {}
    seen_namespaces: dict[str, str] = {}
    for b in backends:
        if b.name in seen_names:
            reader.problem(("backends", b.name), "is defined twice (config and imported file?)")
        seen_names[b.name] = b.name
        held = seen_namespaces.get(b.effective_namespace)
        if held is not None:
            reader.problem(
                ("backends", b.name),
                f"namespace {b.effective_namespace!r} is already used by backend {held!r}",
            )
        seen_namespaces[b.effective_namespace] = b.name

"""Backends from the `mcpServers` JSON that desktop hosts and editors use.

A server from such a file gets the environment a host's SDK stdio client gives it: a short
safe list (PATH, HOME, ...) and the entry's `env`, not the gateway's whole environment
(`inherit_env` stays off). The official SDKs' stdio clients, which most hosts use, pass
exactly that, so a server configured for a host finds what it needs in `env`; and the file may
be served by a shared gateway, whose own secrets must not reach every child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gateway.config.model import (
    _NAME,
    BackendConfig,
    ConfigInvalid,
    HttpTarget,
    SseTarget,
    StdioTarget,
    Target,
    default_connect_timeout,
)


def load_mcp_json(path: Path) -> tuple[BackendConfig, ...]:
    """Backends from the `mcpServers` JSON that desktop hosts and editors use."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigInvalid([f"{path}: cannot read the mcp.json file: {exc.strerror}"]) from None
    except orjson.JSONDecodeError as exc:
        # (orjson's message ends with its own "line L column C (char N)")
        where = f"{path}:{exc.lineno}:{exc.colno}"
        raise ConfigInvalid([f"{where}: not valid JSON: {exc.msg}"]) from None
    servers = data.get("mcpServers", data.get("servers")) if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigInvalid([f"{path}: no 'mcpServers' object"])
    problems: list[str] = []
    out: list[BackendConfig] = []
    for name, entry in servers.items():
        where = f"{path}: mcpServers.{name}"
        if not isinstance(entry, dict) or entry.get("disabled") is True:
            continue
        target = _mcp_json_target(entry)
        if isinstance(target, str):
            problems.append(f"{where}: {target}")
        elif not _NAME.match(name):
            problems.append(f"{where}: a backend name uses letters, digits, '_', '.' and '-'")
        else:
            era = "legacy" if isinstance(target, SseTarget) else "auto"
            timeout = default_connect_timeout(target)
            out.append(BackendConfig(name=name, target=target, era=era, connect_timeout=timeout))
    if problems:
        raise ConfigInvalid(problems)
    return tuple(out)


def _mcp_json_target(entry: dict[str, Any]) -> Target | str:
    kind = entry.get("type", "http" if "url" in entry else "stdio")
    web = ("http", "streamable-http", "streamableHttp", "sse")
    if kind in web and isinstance(entry.get("url"), str):
        headers = entry.get("headers") or {}
        if not isinstance(headers, dict):
            return "headers must be an object"
        target = SseTarget if kind == "sse" else HttpTarget
        return target(url=entry["url"], headers={str(k): str(v) for k, v in headers.items()})
    if kind == "stdio" and isinstance(entry.get("command"), str):
        args, env = entry.get("args") or [], entry.get("env") or {}
        if not isinstance(args, list) or not isinstance(env, dict):
            return "args must be a list and env an object"
        cwd = entry.get("cwd")
        return StdioTarget(
            command=entry["command"],
            args=tuple(str(a) for a in args),
            env={str(k): str(v) for k, v in env.items()},
            cwd=cwd if isinstance(cwd, str) else None,
        )
    return f"unsupported server entry (type {kind!r}; needs 'command' or 'url')"

"""The MCP server entries of desktop hosts and editors, for `client-config` (pure: no file is
read or written here; gateway/cli/clientconfig.py does that).

Each host keeps its servers in a JSON file of its own, under a key of its own:

| host           | file (default)                                  | key          | remote (url) |
| claude-desktop | claude_desktop_config.json in the app's folder  | `mcpServers` | no           |
| claude-code    | `.mcp.json` in the project (project scope)      | `mcpServers` | `type: http` |
| vscode         | `.vscode/mcp.json` in the workspace             | `servers`    | `type: http` |
| cursor         | `~/.cursor/mcp.json` (or `.cursor/mcp.json`)    | `mcpServers` | `url`        |

An entry either starts the gateway on stdio (`connect URL`, a bridge to a gateway's HTTP
endpoint, or `run --config FILE`, a whole gateway the host starts) or, where the host's file
takes remote servers, names the endpoint's URL itself. Claude Desktop's file takes only stdio
servers (remote ones are added in its settings), so it is always given `connect`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath, PureWindowsPath
from typing import Any

import orjson

DEFAULT_URL = "http://127.0.0.1:8080/mcp"  # what `run` and the demo listen on
DEFAULT_NAME = "gateway"
# VS Code's schema for server names (the strictest of the four).
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
MODES = ("stdio", "http")


@dataclass(frozen=True)
class Host:
    name: str
    title: str  # as its makers write it, for messages
    key: str  # the object the servers are kept in
    typed: bool  # entries say their `type` ("stdio" | "http")
    remote: bool  # its file takes a server by URL
    after: str  # what to do for the host to load a changed file


HOSTS: Mapping[str, Host] = {
    h.name: h
    for h in (
        Host(
            "claude-desktop",
            "Claude Desktop",
            "mcpServers",
            typed=False,
            remote=False,
            after="quit and reopen Claude Desktop to load it",
        ),
        Host(
            "claude-code",
            "Claude Code",
            "mcpServers",
            typed=True,
            remote=True,
            after="start `claude` in this project and approve the server (/mcp lists it)",
        ),
        Host(
            "vscode",
            "VS Code",
            "servers",
            typed=True,
            remote=True,
            after="VS Code offers to start it (MCP: List Servers)",
        ),
        Host(
            "cursor",
            "Cursor",
            "mcpServers",
            typed=False,
            remote=True,
            after="Cursor loads it (Settings > MCP; reload the window if it is not listed)",
        ),
    )
}


class HostFileError(Exception):
    """A host's file the command will not touch: one line saying why and what to do."""


@dataclass(frozen=True)
class Launch:
    """How the host reaches the gateway: `command` started on stdio, or `url` over HTTP."""

    mode: str  # "stdio" | "http"
    command: tuple[str, ...] = ()
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


def connect_launch(gateway: Sequence[str], url: str, headers: Mapping[str, str]) -> Launch:
    """The host starts `connect URL`: a stdio bridge to the gateway's HTTP endpoint."""
    args = [*gateway, "connect", url]
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    return Launch("stdio", tuple(args))


def run_launch(gateway: Sequence[str], config: PurePath) -> Launch:
    """The host starts a whole gateway from `config` (which must serve stdio)."""
    return Launch("stdio", (*gateway, "run", "--config", str(config)))


def http_launch(url: str, headers: Mapping[str, str]) -> Launch:
    return Launch("http", url=url, headers=dict(headers))


def choose_mode(host: Host, asked: str | None) -> str:
    """The mode asked for, or the host's best: HTTP where its file takes a URL (no process
    for the host to keep), else stdio."""
    if asked == "http" and not host.remote:
        raise HostFileError(
            f"{host.title}'s config file takes only stdio servers (a remote one is added in "
            "its settings, under Connectors): leave out --http"
        )
    return asked or ("http" if host.remote else "stdio")


def entry(host: Host, launch: Launch) -> dict[str, Any]:
    """The host's entry for the gateway, in the host's documented shape."""
    out: dict[str, Any] = {"type": launch.mode} if host.typed else {}
    if launch.mode == "stdio":
        out["command"] = launch.command[0]
        out["args"] = list(launch.command[1:])
        return out
    out["url"] = launch.url
    if launch.headers:
        out["headers"] = dict(launch.headers)
    return out


def fragment(host: Host, name: str, server: Mapping[str, Any]) -> dict[str, Any]:
    """What `--print` shows: the entry under the host's key, ready to paste."""
    return {host.key: {name: dict(server)}}


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise HostFileError(
            f"--name {name!r}: use a letter, then letters, digits, '_' or '-' (VS Code's rule)"
        )
    return name


def parse_header(value: str) -> tuple[str, str]:
    name, sep, rest = value.partition(":")
    if not sep or not name.strip():
        raise HostFileError(f"-H {value!r}: give a header as 'Name: value'")
    return name.strip(), rest.strip()


def default_path(
    host: Host, platform: str, environ: Mapping[str, str], home: PurePath, cwd: PurePath
) -> PurePath:
    """Where the host reads its servers by default (Claude Code and VS Code: the project's
    file, so the current directory; Cursor: the user's, for every project)."""
    if host.name == "claude-desktop":
        file = "claude_desktop_config.json"
        if platform == "darwin":
            return home / "Library" / "Application Support" / "Claude" / file
        if platform == "win32":
            appdata = environ.get("APPDATA")
            base = PureWindowsPath(appdata) if appdata else home / "AppData" / "Roaming"
            return base / "Claude" / file
        config_home = environ.get("XDG_CONFIG_HOME")
        return (type(home)(config_home) if config_home else home / ".config") / "Claude" / file
    if host.name == "claude-code":
        return cwd / ".mcp.json"
    if host.name == "vscode":
        return cwd / ".vscode" / "mcp.json"
    return home / ".cursor" / "mcp.json"


def read_document(data: bytes, where: str, host: Host) -> dict[str, Any]:
    """The host's file as an object; HostFileError (one line) where it is not one this
    command can add to without losing anything."""
    if not data.strip():
        return {}
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        hint = " (comments or trailing commas?)" if host.name == "vscode" else ""
        raise HostFileError(
            f"{where}:{exc.lineno}:{exc.colno}: not valid JSON{hint}: {exc.msg}; nothing was "
            "changed: fix the file, or add the entry by hand (--print shows it)"
        ) from None
    if not isinstance(document, dict):
        raise HostFileError(
            f"{where}: holds a JSON {type(document).__name__}, not an object; nothing was "
            "changed: fix the file, or add the entry by hand (--print shows it)"
        )
    servers = document.get(host.key)
    if servers is not None and not isinstance(servers, dict):
        raise HostFileError(
            f"{where}: {host.key!r} is not an object; nothing was changed: fix the file, or "
            "add the entry by hand (--print shows it)"
        )
    return document


def merge(
    document: Mapping[str, Any], host: Host, name: str, server: Mapping[str, Any]
) -> tuple[dict[str, Any], str]:
    """The document with the entry in it (every other key and server kept, in their order),
    and what changed: "added", "replaced" or "unchanged"."""
    servers = dict(document.get(host.key) or {})
    before = servers.get(name)
    if before == server:
        return dict(document), "unchanged"
    servers[name] = dict(server)
    return {**document, host.key: servers}, "added" if before is None else "replaced"


def render(document: Mapping[str, Any]) -> bytes:
    """Two-space indented JSON, as the hosts' own editors write it."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)

"""YAML config -> validated, frozen config objects.

A leaf module: it imports nothing else of the gateway. Errors name the file, the line and the
dotted path of the offending value, and all of them are reported at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8080
DEFAULT_HTTP_PATH = "/mcp"
# 4 MiB holds any realistic tool call; larger bodies are far more likely abuse than use.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# How long a backend may take to accept a connection or (stdio) to come back after a crash.
DEFAULT_CONNECT_TIMEOUT = 10.0
# Whole-request bound; long tool calls are normal in MCP, so this is generous.
DEFAULT_REQUEST_TIMEOUT = 300.0
# The admin listener (/metrics, health) defaults to the port OpenTelemetry's Prometheus exporter
# uses by convention, so scrape configs written for it need no change.
DEFAULT_ADMIN_PORT = 9464
# A recording is for looking at, not an archive: 64 MiB per file is hours of busy traffic, and
# (1 + backups) files bound the disk it can take.
DEFAULT_TAP_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TAP_BACKUPS = 3
# One message beyond this (a huge resource read) is recorded as its size only, so one blob cannot
# push hours of traffic out of the rotation.
DEFAULT_TAP_MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_SERVICE_NAME = "mcp-gateway"
# `telemetry.access_log: stderr` logs to the gateway's stderr; any other value is a file path.
ACCESS_LOG_STDERR = "stderr"

# Addresses that bind every interface, and so clash with any other host on the same port.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# A redaction rule: dot-separated keys (or `*`, or a list index), none empty.
_REDACT_PATH = re.compile(r"[^.\s]+(?:\.[^.\s]+)*")
# An HTTP field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class ConfigInvalid(Exception):
    """The config cannot be used; `problems` lists every reason, each with its line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class HttpListen:
    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_HTTP_PORT
    path: str = DEFAULT_HTTP_PATH
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class AdminListen:
    """A separate HTTP listener for /metrics and health, so a stdio-only gateway can be scraped."""

    host: str = DEFAULT_HTTP_HOST
    port: int = DEFAULT_ADMIN_PORT


@dataclass(frozen=True)
class Listen:
    http: HttpListen | None = None
    stdio: bool = False
    admin: AdminListen | None = None  # not a front end: it serves no MCP


@dataclass(frozen=True)
class TapConfig:
    """Opt-in recording of every JSON-RPC message on both hops to a JSON-lines file."""

    path: str  # absolute: a relative path in the file is resolved against the file's directory
    redact: tuple[str, ...] = ()  # dotted paths into a message; `*` matches one level
    redact_headers: tuple[str, ...] = ()  # besides Authorization and Cookie, always redacted
    max_bytes: int = DEFAULT_TAP_MAX_BYTES
    backups: int = DEFAULT_TAP_BACKUPS
    max_message_bytes: int = DEFAULT_TAP_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class TelemetryConfig:
    service_name: str = DEFAULT_SERVICE_NAME
    otlp_endpoint: str | None = None  # None: no traces are exported
    record_payloads: bool = False  # put message bodies on spans (they may hold secrets)
    access_log: str | None = None  # None: off; "stderr"; or an absolute file path


@dataclass(frozen=True)
class StdioTarget:
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


@dataclass(frozen=True)
class HttpTarget:
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendConfig:
    name: str
    target: StdioTarget | HttpTarget
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    namespace: str = ""  # empty: the backend's name
    allow_tools: tuple[str, ...] = ()
    deny_tools: tuple[str, ...] = ()
    rename_tools: Mapping[str, str] = field(default_factory=dict)

    @property
    def effective_namespace(self) -> str:
        return self.namespace or self.name


PREFIX_MODES = ("auto", "always", "never")
FAILURE_POLICIES = ("fail_open", "fail_closed")


@dataclass(frozen=True)
class Namespacing:
    prefix: str = "auto"
    separator: str = "_"
    max_name_length: int = 64


@dataclass(frozen=True)
class Config:
    listen: Listen
    backends: tuple[BackendConfig, ...]
    source: str = "<config>"
    namespacing: Namespacing = Namespacing()
    on_backend_failure: str = "fail_open"
    tap: TapConfig | None = None
    telemetry: TelemetryConfig = TelemetryConfig()


# --- YAML with line numbers -------------------------------------------------------------------


class _Reader:
    """Turns a composed YAML node tree into plain values, remembering each value's line."""

    def __init__(self, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.lines: dict[tuple[str, ...], int] = {}
        # The source text of each scalar: header values and env entries are strings even when
        # YAML 1.1 would read them as booleans or numbers (`yes`, `on`, `0755`).
        self.text: dict[tuple[str, ...], str] = {}
        self.problems: list[str] = []
        self._scalars = yaml.SafeLoader("")

    def value(self, node: yaml.Node, path: tuple[str, ...]) -> Any:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in out:
                    self.problem(path + (key,), "appears twice", key_node.start_mark.line + 1)
                out[key] = self.value(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.value(v, path + (str(i),)) for i, v in enumerate(node.value)]
        scalar = self._scalars.construct_object(node)
        if isinstance(scalar, str):
            scalar = self.interpolate(scalar, path)
        self.text[path] = scalar if isinstance(scalar, str) else str(node.value)
        return scalar

    def interpolate(self, text: str, path: tuple[str, ...]) -> str:
        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in self.env:
                return self.env[name]
            if default is not None:
                return default
            self.problem(path, f"environment variable {name} is not set")
            return ""

        return _ENV_REF.sub(sub, text)

    def problem(self, path: tuple[str, ...], message: str, line: int | None = None) -> None:
        where = line if line is not None else self._nearest_line(path)
        dotted = ".".join(path) or "(top level)"
        self.problems.append(f"{self.source}:{where}: {dotted}: {message}")

    def _nearest_line(self, path: tuple[str, ...]) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)


# --- validation -------------------------------------------------------------------------------


class _Check:
    def __init__(self, reader: _Reader) -> None:
        self.r = reader

    def mapping(
        self, value: Any, path: tuple[str, ...], keys: set[str] | None = None
    ) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.r.problem(path, "must be a mapping")
            return {}
        if keys is not None:
            allowed = ", ".join(sorted(keys))
            for key in value.keys() - keys:
                self.r.problem(path + (key,), f"unknown key (expected one of: {allowed})")
        return value

    def string(self, value: Any, path: tuple[str, ...], default: str | None = None) -> str | None:
        if value is None:
            return default
        if not isinstance(value, str):
            self.r.problem(path, "must be a string")
            return default
        return value

    def number(self, value: Any, path: tuple[str, ...], default: float) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.r.problem(path, "must be a positive number")
            return default
        return float(value)

    def port(self, value: Any, path: tuple[str, ...]) -> int:
        if value is None:
            return DEFAULT_HTTP_PORT
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            self.r.problem(path, "must be a port number from 0 to 65535")
            return DEFAULT_HTTP_PORT
        return value

    def count(self, value: Any, path: tuple[str, ...], default: int, minimum: int = 1) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.r.problem(path, f"must be a whole number of at least {minimum}")
            return default
        return value

    def boolean(self, value: Any, path: tuple[str, ...], default: bool = False) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.r.problem(path, "must be true or false")
            return default
        return value

    def strings(self, value: Any, path: tuple[str, ...]) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            self.r.problem(path, "must be a list of strings")
            return ()
        return tuple(str(v) for v in value)

    def string_map(self, value: Any, path: tuple[str, ...]) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.r.problem(path, "must be a mapping of names to strings")
            return {}
        out: dict[str, str] = {}
        for key, item in value.items():
            if isinstance(item, (dict, list)) or item is None:
                self.r.problem(path + (key,), "must be a string")
            else:
                out[key] = item if isinstance(item, str) else self.r.text[path + (key,)]
        return out


def _listen(c: _Check, raw: Any) -> Listen:
    body = c.mapping(raw, ("listen",), {"http", "stdio", "admin"})
    http: HttpListen | None = None
    if body.get("http") is not None:
        path = ("listen", "http")
        h = c.mapping(
            body["http"],
            path,
            {"host", "port", "path", "allowed_origins", "allowed_hosts", "max_body_bytes"},
        )
        url_path = c.string(h.get("path"), path + ("path",), DEFAULT_HTTP_PATH) or "/"
        if not url_path.startswith("/"):
            c.r.problem(path + ("path",), "must start with /")
        http = HttpListen(
            host=c.string(h.get("host"), path + ("host",), DEFAULT_HTTP_HOST) or DEFAULT_HTTP_HOST,
            port=c.port(h.get("port"), path + ("port",)),
            path=url_path,
            allowed_origins=c.strings(h.get("allowed_origins"), path + ("allowed_origins",)),
            allowed_hosts=c.strings(h.get("allowed_hosts"), path + ("allowed_hosts",)),
            max_body_bytes=int(
                c.number(
                    h.get("max_body_bytes"), path + ("max_body_bytes",), DEFAULT_MAX_BODY_BYTES
                )
            ),
        )
    stdio = c.boolean(body.get("stdio"), ("listen", "stdio"))
    admin = _admin(c, body.get("admin"), http)
    if http is None and not stdio:
        also = " (admin serves metrics and health, not MCP)" if admin is not None else ""
        c.r.problem(("listen",), f"name at least one front end: http, stdio or both{also}")
    return Listen(http=http, stdio=stdio, admin=admin)


def _same_interface(a: str, b: str) -> bool:
    return a == b or bool(WILDCARD_HOSTS & {a, b})


def _admin(c: _Check, raw: Any, http: HttpListen | None) -> AdminListen | None:
    if raw is None:
        return None
    path = ("listen", "admin")
    body = c.mapping(raw, path, {"host", "port"})
    host = c.string(body.get("host"), path + ("host",), DEFAULT_HTTP_HOST) or DEFAULT_HTTP_HOST
    port = (
        DEFAULT_ADMIN_PORT if body.get("port") is None else c.port(body["port"], path + ("port",))
    )
    # Port 0 picks a free port for each listener, so only a fixed port can clash.
    if http is not None and port and port == http.port and _same_interface(http.host, host):
        c.r.problem(path + ("port",), f"must differ from listen.http.port ({http.port})")
    return AdminListen(host=host, port=port)


def _backend(c: _Check, name: str, raw: Any) -> BackendConfig | None:
    path = ("backends", name)
    if not _NAME.match(name):
        c.r.problem(path, "a backend name uses letters, digits, '_', '.' and '-'")
    body = c.mapping(
        raw,
        path,
        {"stdio", "http", "connect_timeout", "request_timeout", "namespace", "tools", "rename"},
    )
    kinds = [k for k in ("stdio", "http") if body.get(k) is not None]
    if len(kinds) != 1:
        c.r.problem(path, "needs exactly one of stdio or http")
        return None
    target: StdioTarget | HttpTarget
    if kinds[0] == "stdio":
        sp = path + ("stdio",)
        s = c.mapping(body["stdio"], sp, {"command", "args", "env", "cwd"})
        command = c.string(s.get("command"), sp + ("command",))
        if not command:
            c.r.problem(sp + ("command",), "is required")
        target = StdioTarget(
            command=command or "",
            args=c.strings(s.get("args"), sp + ("args",)),
            env=c.string_map(s.get("env"), sp + ("env",)),
            cwd=c.string(s.get("cwd"), sp + ("cwd",)),
        )
    else:
        hp = path + ("http",)
        h = c.mapping(body["http"], hp, {"url", "headers"})
        url = c.string(h.get("url"), hp + ("url",))
        if not url or not re.match(r"^https?://", url):
            c.r.problem(hp + ("url",), "must be an http:// or https:// URL")
        target = HttpTarget(
            url=url or "", headers=c.string_map(h.get("headers"), hp + ("headers",))
        )
    namespace = c.string(body.get("namespace"), path + ("namespace",), "") or ""
    if namespace and not _NAME.match(namespace):
        c.r.problem(path + ("namespace",), "a namespace uses letters, digits, '_', '.' and '-'")
    tools = c.mapping(body.get("tools"), path + ("tools",), {"allow", "deny"})
    return BackendConfig(
        name=name,
        target=target,
        namespace=namespace,
        allow_tools=c.strings(tools.get("allow"), path + ("tools", "allow")),
        deny_tools=c.strings(tools.get("deny"), path + ("tools", "deny")),
        rename_tools=c.string_map(body.get("rename"), path + ("rename",)),
        connect_timeout=c.number(
            body.get("connect_timeout"), path + ("connect_timeout",), DEFAULT_CONNECT_TIMEOUT
        ),
        request_timeout=c.number(
            body.get("request_timeout"), path + ("request_timeout",), DEFAULT_REQUEST_TIMEOUT
        ),
    )


def parse(
    text: str,
    source: str = "<config>",
    env: Mapping[str, str] | None = None,
    extra_backends: tuple[BackendConfig, ...] = (),
) -> Config:
    reader = _Reader(source, os.environ if env is None else env)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise ConfigInvalid([f"{source}:{line}: not valid YAML: {exc}"]) from None
    raw = reader.value(node, ()) if node is not None else {}
    check = _Check(reader)
    top = check.mapping(
        raw,
        (),
        {"listen", "backends", "backends_from", "namespacing", "fan_out", "tap", "telemetry"},
    )
    listen = _listen(check, top.get("listen"))
    backends: list[BackendConfig] = []
    for name, body in check.mapping(top.get("backends"), ("backends",)).items():
        backend = _backend(check, name, body)
        if backend is not None:
            backends.append(backend)
    imported = check.string(top.get("backends_from"), ("backends_from",))
    if imported:
        try:
            backends.extend(load_mcp_json(_beside(source, imported)))
        except ConfigInvalid as exc:
            for problem in exc.problems:
                reader.problem(("backends_from",), problem)
    backends.extend(extra_backends)
    if not top.get("backends") and not imported and not extra_backends:
        reader.problem(("backends",), "name at least one backend")
    _check_backend_names(reader, backends)
    config = Config(
        listen=listen,
        backends=tuple(backends),
        source=source,
        namespacing=_namespacing(check, top.get("namespacing")),
        on_backend_failure=_failure_policy(check, top.get("fan_out")),
        tap=_tap(check, top.get("tap"), source),
        telemetry=_telemetry(check, top.get("telemetry"), source),
    )
    if reader.problems:
        raise ConfigInvalid(reader.problems)
    return config


def _beside(source: str, relative: str) -> Path:
    """A path named in the config file, relative to that file (or to the cwd for parsed text)."""
    base = Path(source).parent if source != "<config>" else Path.cwd()
    return (base / Path(relative).expanduser()).absolute()


def _tap(c: _Check, raw: Any, source: str) -> TapConfig | None:
    if raw is None:
        return None
    path = ("tap",)
    body = c.mapping(
        raw,
        path,
        {"path", "redact", "redact_headers", "max_bytes", "backups", "max_message_bytes"},
    )
    file = c.string(body.get("path"), path + ("path",))
    if not file:
        c.r.problem(path + ("path",), "is required (the JSON-lines file to record to)")
    redact = c.strings(body.get("redact"), path + ("redact",))
    for i, rule in enumerate(redact):
        if not _REDACT_PATH.fullmatch(rule):
            c.r.problem(path + ("redact", str(i)), "must be a dotted path like params.arguments.*")
    headers = c.strings(body.get("redact_headers"), path + ("redact_headers",))
    for i, name in enumerate(headers):
        if not _HEADER_NAME.fullmatch(name):
            c.r.problem(path + ("redact_headers", str(i)), "must be an HTTP header name")
    return TapConfig(
        path=str(_beside(source, file)) if file else "",
        redact=redact,
        redact_headers=headers,
        max_bytes=c.count(body.get("max_bytes"), path + ("max_bytes",), DEFAULT_TAP_MAX_BYTES),
        backups=c.count(body.get("backups"), path + ("backups",), DEFAULT_TAP_BACKUPS, 0),
        max_message_bytes=c.count(
            body.get("max_message_bytes"),
            path + ("max_message_bytes",),
            DEFAULT_TAP_MAX_MESSAGE_BYTES,
        ),
    )


def _telemetry(c: _Check, raw: Any, source: str) -> TelemetryConfig:
    path = ("telemetry",)
    body = c.mapping(raw, path, {"service_name", "otlp_endpoint", "record_payloads", "access_log"})
    service = c.string(body.get("service_name"), path + ("service_name",), DEFAULT_SERVICE_NAME)
    if not service:
        c.r.problem(path + ("service_name",), "must not be empty")
    endpoint = c.string(body.get("otlp_endpoint"), path + ("otlp_endpoint",))
    if endpoint is not None and not re.match(r"^https?://", endpoint):
        c.r.problem(path + ("otlp_endpoint",), "must be an http:// or https:// URL")
    access_log = c.string(body.get("access_log"), path + ("access_log",))
    if access_log == "":
        c.r.problem(path + ("access_log",), f"must be {ACCESS_LOG_STDERR!r} or a file path")
    elif access_log is not None and access_log != ACCESS_LOG_STDERR:
        access_log = str(_beside(source, access_log))
    return TelemetryConfig(
        service_name=service or DEFAULT_SERVICE_NAME,
        otlp_endpoint=endpoint,
        record_payloads=c.boolean(body.get("record_payloads"), path + ("record_payloads",)),
        access_log=access_log or None,
    )


def _check_backend_names(reader: _Reader, backends: list[BackendConfig]) -> None:
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


def _namespacing(c: _Check, raw: Any) -> Namespacing:
    path = ("namespacing",)
    body = c.mapping(raw, path, {"prefix", "separator", "max_name_length"})
    prefix = c.string(body.get("prefix"), path + ("prefix",), "auto") or "auto"
    if prefix not in PREFIX_MODES:
        c.r.problem(path + ("prefix",), f"must be one of {', '.join(PREFIX_MODES)}")
    separator = c.string(body.get("separator"), path + ("separator",), "_") or "_"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,3}", separator):
        c.r.problem(path + ("separator",), "must be 1 to 3 of letters, digits, '_', '.', '-'")
    length = c.number(body.get("max_name_length"), path + ("max_name_length",), 64)
    if not 16 <= length <= 128:
        c.r.problem(path + ("max_name_length",), "must be from 16 to 128")
    return Namespacing(prefix=prefix, separator=separator, max_name_length=int(length))


def _failure_policy(c: _Check, raw: Any) -> str:
    body = c.mapping(raw, ("fan_out",), {"on_failure"})
    policy = c.string(body.get("on_failure"), ("fan_out", "on_failure"), "fail_open")
    if policy not in FAILURE_POLICIES:
        c.r.problem(("fan_out", "on_failure"), f"must be one of {', '.join(FAILURE_POLICIES)}")
    return policy or "fail_open"


def load_mcp_json(path: Path) -> tuple[BackendConfig, ...]:
    """Backends from the `mcpServers` JSON that desktop hosts and editors use."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigInvalid([f"{path}: cannot read: {exc.strerror}"]) from None
    except orjson.JSONDecodeError as exc:
        raise ConfigInvalid([f"{path}: not valid JSON: {exc}"]) from None
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
            out.append(BackendConfig(name=name, target=target))
    if problems:
        raise ConfigInvalid(problems)
    return tuple(out)


def _mcp_json_target(entry: dict[str, Any]) -> StdioTarget | HttpTarget | str:
    kind = entry.get("type", "http" if "url" in entry else "stdio")
    if kind in ("http", "streamable-http", "streamableHttp") and isinstance(entry.get("url"), str):
        headers = entry.get("headers") or {}
        if not isinstance(headers, dict):
            return "headers must be an object"
        return HttpTarget(url=entry["url"], headers={str(k): str(v) for k, v in headers.items()})
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


def load(
    path: str | Path,
    env: Mapping[str, str] | None = None,
    extra_backends: tuple[BackendConfig, ...] = (),
) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigInvalid([f"{p}: cannot read: {exc.strerror}"]) from None
    return parse(text, str(p), env, extra_backends)


def describe(config: Config) -> str:
    """A human summary of what `run` would start, for `check-config`."""
    lines = [f"config {config.source}: OK"]
    if config.listen.http is not None:
        h = config.listen.http
        lines.append(f"  listen http  http://{h.host}:{h.port}{h.path}")
    if config.listen.stdio:
        lines.append("  listen stdio")
    if config.listen.admin is not None:
        a = config.listen.admin
        lines.append(f"  listen admin http://{a.host}:{a.port} (metrics and health)")
    n = config.namespacing
    lines.append(
        f"  namespacing  prefix={n.prefix} separator={n.separator!r} max={n.max_name_length}"
        f"  on backend failure: {config.on_backend_failure}"
    )
    for b in config.backends:
        if b.namespace:
            lines.append(f"  backend {b.name}: namespace {b.namespace}")
        if isinstance(b.target, StdioTarget):
            cmd = " ".join([b.target.command, *b.target.args])
            lines.append(f"  backend {b.name}: stdio `{cmd}`")
        else:
            lines.append(f"  backend {b.name}: http {b.target.url}")
    t = config.telemetry
    lines.append(
        f"  telemetry    service={t.service_name} traces={t.otlp_endpoint or 'off'}"
        f" access log={t.access_log or 'off'}"
        f" payloads on spans={'yes' if t.record_payloads else 'no'}"
    )
    if config.tap is not None:
        tap = config.tap
        lines.append(
            f"  tap          {tap.path} (rotates at {_mib(tap.max_bytes)}, keeps {tap.backups}"
            f" old; redacts {len(tap.redact)} paths, Authorization, Cookie"
            f"{''.join(', ' + h for h in tap.redact_headers)})"
        )
    return "\n".join(lines)


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB" if size >= 1024 * 1024 else f"{size} bytes"

"""YAML config -> validated, frozen config objects.

A leaf package: it imports nothing else of the gateway. Errors name the file, the line and the
dotted path of the offending value, and all of them are reported at once. This module is the
loader (the top level, the small sections, the checks across sections); a larger section has a
module of its own (backends.py, auth.py, policy.py, ...), and describe.py summarises a config.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.config import auth as auth_section
from gateway.config import backends as backends_section
from gateway.config import cluster as cluster_section
from gateway.config import hook_loader, keys, pins_loader, search_loader
from gateway.config import http as http_sections
from gateway.config import limits as limit_sections
from gateway.config import policy as policy_sections
from gateway.config import servers as server_sections
from gateway.config.access import PolicyConfig, PolicyRule, PolicyTarget, PolicyWhen
from gateway.config.checks import missing_commands
from gateway.config.credentials import (
    ApiKey,
    AuthConfig,
    BackendAuth,
    ClusterConfig,
    Introspection,
)
from gateway.config.describe import describe
from gateway.config.hooks import HookConfig
from gateway.config.listeners import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_HTTP_HOST,
    DEFAULT_HTTP_PATH,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_BODY_BYTES,
    AdminListen,
    ConfiguredIdentity,
    HttpListen,
    Listen,
    ListenerLimits,
    ServerTls,
)
from gateway.config.mcpjson import load_mcp_json
from gateway.config.model import (
    _HEADER_NAME,
    _REDACT_PATH,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STDIO_CONNECT_TIMEOUT,
    FAILURE_POLICIES,
    PREFIX_MODES,
    WILDCARD_HOSTS,
    BackendConfig,
    BackendLimits,
    ClientTls,
    Config,
    ConfigInvalid,
    HttpTarget,
    Namespacing,
    Root,
    SseTarget,
    StdioTarget,
    Target,
    default_connect_timeout,
)
from gateway.config.operations import (
    ACCESS_LOG_STDERR,
    AUDIT_STDERR,
    DEFAULT_SERVICE_NAME,
    DEFAULT_STDOUT_STALL_TIMEOUT,
    DEFAULT_TAP_BACKUPS,
    DEFAULT_TAP_MAX_BYTES,
    DEFAULT_TAP_MAX_MESSAGE_BYTES,
    AuditConfig,
    Overload,
    Rate,
    RateLimits,
    Shutdown,
    TapConfig,
    TelemetryConfig,
)
from gateway.config.reader import _Check, _Reader
from gateway.config.virtual import ServerAuth, ServerBackend, ServerConfig


def _listen(c: _Check, raw: Any, base: Path) -> Listen:
    body = c.mapping(raw, ("listen",), keys.names("listen"))
    http: HttpListen | None = None
    if body.get("http") is not None:
        path = ("listen", "http")
        h = c.mapping(body["http"], path, keys.names("listen_http"))
        t = keys.table("listen_http")
        url_path = c.field(h, path, "path", t["path"]) or "/"
        if not url_path.startswith("/"):
            c.r.problem(path + ("path",), "must start with /")
        http = HttpListen(
            host=c.field(h, path, "host", t["host"]) or DEFAULT_HTTP_HOST,
            port=c.field(h, path, "port", t["port"]),
            path=url_path,
            allowed_origins=c.field(h, path, "allowed_origins", t["allowed_origins"]),
            allowed_hosts=c.field(h, path, "allowed_hosts", t["allowed_hosts"]),
            limits=http_sections.listener_limits(
                c, h.get("limits"), path + ("limits",), h.get("max_body_bytes")
            ),
            tls=http_sections.server_tls(c, h.get("tls"), path + ("tls",), base),
            session_idle_timeout=c.field(
                h, path, "session_idle_timeout", t["session_idle_timeout"]
            ),
        )
    stdio, identity = policy_sections.stdio(c, body.get("stdio"))
    admin = _admin(c, body.get("admin"), http)
    if http is None and not stdio:
        also = " (admin serves metrics and health, not MCP)" if admin is not None else ""
        c.r.problem(("listen",), f"name at least one front end: http, stdio or both{also}")
    return Listen(http=http, stdio=stdio, admin=admin, stdio_identity=identity)


def _same_interface(a: str, b: str) -> bool:
    return a == b or bool(WILDCARD_HOSTS & {a, b})


def _admin(c: _Check, raw: Any, http: HttpListen | None) -> AdminListen | None:
    if raw is None:
        return None
    path = ("listen", "admin")
    body = c.mapping(raw, path, keys.names("admin"))
    t = keys.table("admin")
    host = c.field(body, path, "host", t["host"]) or DEFAULT_HTTP_HOST
    port: int = c.field(body, path, "port", t["port"])
    # Port 0 picks a free port for each listener, so only a fixed port can clash.
    if http is not None and port and port == http.port and _same_interface(http.host, host):
        c.r.problem(path + ("port",), f"must differ from listen.http.port ({http.port})")
    return AdminListen(host=host, port=port)


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
        raise ConfigInvalid([yaml_syntax_error(source, exc)]) from None
    raw = reader.value(node, ()) if node is not None else {}
    check = _Check(reader)
    top = check.mapping(raw, (), keys.names("config"))
    base = _beside(source, ".")
    listen = _listen(check, top.get("listen"), base)
    backends: list[BackendConfig] = []
    for name, body in check.mapping(top.get("backends"), ("backends",)).items():
        backend = backends_section.backend(check, name, body, base)
        if backend is not None:
            backends.append(backend)
    imported = check.field(top, (), "backends_from", keys.table("config")["backends_from"])
    if imported:
        try:
            backends.extend(load_mcp_json(_beside(source, imported)))
        except ConfigInvalid as exc:
            for problem in exc.problems:
                reader.problem(("backends_from",), problem)
    backends.extend(extra_backends)
    if not top.get("backends") and not imported and not extra_backends:
        reader.problem(("backends",), "name at least one backend")
    backends_section.check_names(reader, backends)
    namespacing = server_sections.namespacing(check, top.get("namespacing"))
    on_failure, grace, start_wait = _fan_out(check, top.get("fan_out"))
    config = Config(
        listen=listen,
        backends=tuple(backends),
        source=source,
        namespacing=namespacing,
        on_backend_failure=on_failure,
        fan_out_grace=grace,
        fan_out_start_wait=start_wait,
        tap=_tap(check, top.get("tap"), source),
        telemetry=_telemetry(check, top.get("telemetry"), source),
        policy=policy_sections.policy(check, top.get("policy"), [b.name for b in backends]),
        rate_limits=limit_sections.rate_limits(check, top.get("rate_limits")),
        overload=limit_sections.overload(check, top.get("overload")),
        shutdown=limit_sections.shutdown(check, top.get("shutdown")),
        audit=limit_sections.audit(check, top.get("audit"), lambda p: _beside(source, p)),
        auth=auth_section.auth(check, top.get("auth"), listen.http),
        cluster=cluster_section.cluster(check, top.get("cluster"), lambda p: _beside(source, p)),
        tool_search=search_loader.tool_search(check, top.get("tool_search")),
        pins=pins_loader.pins(check, top.get("pins"), lambda p: _beside(source, p)),
        task_key_file=_task_key_file(check, top.get("tasks"), source),
        hooks=hook_loader.hooks(check, top.get("hooks"), ("hooks",)),
        servers=server_sections.servers(
            check, top.get("servers"), backends, listen.http, listen.stdio
        ),
    )
    for backend in config.backends:
        if backend.pins is not None and config.pins is None:
            reader.problem(("backends", backend.name, "pins"), "needs the top-level pins:")
    if config.auth is None:
        for server in config.servers:
            if server.auth is not None:
                reader.problem(("servers", server.name, "auth"), "needs the top-level auth:")
    unserved = config.auth is None or config.listen.http is None
    unchecked = config.auth is None or not (config.auth.issuer and config.auth.login_client_id)
    for backend in config.backends:
        if backend.auth is not None and backend.auth.type == "token_exchange" and unserved:
            why = "needs listen.http with auth: (the callers' tokens it exchanges)"
            reader.problem(("backends", backend.name, "auth", "type"), why)
        if backend.auth is None or not backend.auth.per_user:
            continue
        where = ("backends", backend.name, "auth", "per_user")
        if unserved:
            why = "needs listen.http with auth: (callers' identities; logins are served there)"
            reader.problem(where, why)
        elif unchecked:
            # client/elicitation, Phishing: who opens a link must be shown to be its caller.
            why = "needs auth.issuer and auth.login_client_id (to check who opens a login link)"
            reader.problem(where, why)
    if reader.problems:
        raise ConfigInvalid(reader.problems)
    return config


def yaml_syntax_error(source: str, exc: yaml.YAMLError) -> str:
    """One line naming the file, line and column (PyYAML's own text names `<unicode string>`
    and spans several lines, quoting the source)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    value = _unquoted_variable(mark) if mark is not None else None
    if mark is not None and value is not None:
        return (
            f"{source}:{mark.line + 1}:{mark.column}: quote a ${{VAR}} inside {{...}} or [...]:"
            f' write "{value}" (unquoted, YAML reads its {{ as the start of a mapping)'
        )
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark:
        problem += f" ({context} that starts at {context_mark.line + 1}:{context_mark.column + 1})"
    return f"{where}: not valid YAML: {problem}"


# The rest of the plain value after a `${`: on to the next `,`, `}`, `]` or the line's end.
_VARIABLE = re.compile(r"\$\{[^}\s]*\}?[^,}\]\n]*")


def _unquoted_variable(mark: Any) -> str | None:
    """The plain value holding a `${VAR}` where YAML choked on its `{` (a plain scalar inside a
    flow mapping or sequence ends at `{`, which the flow reads as a nested mapping; issue 36)."""
    buffer, pointer = getattr(mark, "buffer", None), getattr(mark, "pointer", None)
    if not isinstance(buffer, str) or not isinstance(pointer, int) or pointer < 1:
        return None
    found = _VARIABLE.match(buffer, pointer - 1)
    if found is None:
        return None
    # Its start: after the flow's `{`, `[` or `,`, or a key's `: `, on the same line.
    head = buffer[buffer.rfind("\n", 0, pointer - 1) + 1 : pointer - 1]
    for stop in ("{", "[", ",", ": "):
        head = head.rpartition(stop)[2]
    return (head + found.group()).strip()


def _beside(source: str, relative: str) -> Path:
    """A path named in the config file, relative to that file (or to the cwd for parsed text)."""
    base = Path(source).parent if source != "<config>" else Path.cwd()
    return (base / Path(relative).expanduser()).absolute()


def _tap(c: _Check, raw: Any, source: str) -> TapConfig | None:
    if raw is None:
        return None
    path = ("tap",)
    body = c.mapping(raw, path, keys.names("tap"))
    t = keys.table("tap")
    file = c.field(body, path, "path", t["path"])
    if not file:
        c.r.problem(path + ("path",), "is required (the JSON-lines file to record to)")
    redact = c.field(body, path, "redact", t["redact"])
    for i, rule in enumerate(redact):
        if not _REDACT_PATH.fullmatch(rule):
            c.r.problem(path + ("redact", str(i)), "must be a dotted path like params.arguments.*")
    headers = c.field(body, path, "redact_headers", t["redact_headers"])
    for i, name in enumerate(headers):
        if not _HEADER_NAME.fullmatch(name):
            c.r.problem(path + ("redact_headers", str(i)), "must be an HTTP header name")
    return TapConfig(
        path=str(_beside(source, file)) if file else "",
        redact=redact,
        redact_headers=headers,
        **c.scalars(body, path, TapConfig, skip={"path", "redact", "redact_headers"}),
    )


def _telemetry(c: _Check, raw: Any, source: str) -> TelemetryConfig:
    path = ("telemetry",)
    body = c.mapping(raw, path, keys.names("telemetry"))
    t = keys.table("telemetry")
    service = c.field(body, path, "service_name", t["service_name"])
    if not service:
        c.r.problem(path + ("service_name",), "must not be empty")
    endpoint = c.field(body, path, "otlp_endpoint", t["otlp_endpoint"])
    if endpoint is not None and not re.match(r"^https?://", endpoint):
        c.r.problem(path + ("otlp_endpoint",), "must be an http:// or https:// URL")
    access_log = c.field(body, path, "access_log", t["access_log"])
    if access_log == "":
        c.r.problem(path + ("access_log",), f"must be {ACCESS_LOG_STDERR!r} or a file path")
    elif access_log is not None and access_log != ACCESS_LOG_STDERR:
        access_log = str(_beside(source, access_log))
    return TelemetryConfig(
        service_name=service or DEFAULT_SERVICE_NAME,
        otlp_endpoint=endpoint,
        access_log=access_log or None,
        **c.scalars(
            body, path, TelemetryConfig, skip={"service_name", "otlp_endpoint", "access_log"}
        ),
    )


def _task_key_file(c: _Check, raw: Any, source: str) -> str | None:
    body = c.mapping(raw, ("tasks",), keys.names("tasks"))
    file = c.field(body, ("tasks",), "key_file", keys.table("tasks")["key_file"])
    return str(_beside(source, file)) if file else None


def _fan_out(c: _Check, raw: Any) -> tuple[str, float, float]:
    body = c.mapping(raw, ("fan_out",), keys.names("fan_out"))
    policy = c.field(body, ("fan_out",), "on_failure", keys.table("fan_out")["on_failure"])
    if policy not in FAILURE_POLICIES:
        c.r.problem(("fan_out", "on_failure"), f"must be one of {', '.join(FAILURE_POLICIES)}")
    grace = c.field(body, ("fan_out",), "grace", keys.table("fan_out")["grace"])
    start_wait = c.field(body, ("fan_out",), "start_wait", keys.table("fan_out")["start_wait"])
    return policy or "fail_open", grace, start_wait


def load(
    path: str | Path,
    env: Mapping[str, str] | None = None,
    extra_backends: tuple[BackendConfig, ...] = (),
) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigInvalid([f"{p}: cannot read the config file: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        at = f"byte {exc.start + 1}"
        raise ConfigInvalid([f"{p}: not a UTF-8 text file ({at}); save it as UTF-8"]) from None
    return parse(text, str(p), env, extra_backends)


__all__ = [
    "ACCESS_LOG_STDERR",
    "AUDIT_STDERR",
    "DEFAULT_ADMIN_PORT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_HTTP_HOST",
    "DEFAULT_HTTP_PATH",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SERVICE_NAME",
    "DEFAULT_STDIO_CONNECT_TIMEOUT",
    "DEFAULT_STDOUT_STALL_TIMEOUT",
    "DEFAULT_TAP_BACKUPS",
    "DEFAULT_TAP_MAX_BYTES",
    "DEFAULT_TAP_MAX_MESSAGE_BYTES",
    "FAILURE_POLICIES",
    "PREFIX_MODES",
    "WILDCARD_HOSTS",
    "AdminListen",
    "ApiKey",
    "AuditConfig",
    "AuthConfig",
    "BackendAuth",
    "BackendConfig",
    "BackendLimits",
    "ClientTls",
    "ClusterConfig",
    "Config",
    "ConfigInvalid",
    "ConfiguredIdentity",
    "HookConfig",
    "HttpListen",
    "HttpTarget",
    "Introspection",
    "Listen",
    "ListenerLimits",
    "Namespacing",
    "Overload",
    "PolicyConfig",
    "PolicyRule",
    "PolicyTarget",
    "PolicyWhen",
    "Rate",
    "RateLimits",
    "Root",
    "ServerAuth",
    "ServerBackend",
    "ServerConfig",
    "ServerTls",
    "Shutdown",
    "SseTarget",
    "StdioTarget",
    "TapConfig",
    "Target",
    "TelemetryConfig",
    "default_connect_timeout",
    "describe",
    "load",
    "load_mcp_json",
    "missing_commands",
    "parse",
]

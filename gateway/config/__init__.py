"""YAML config -> validated, frozen config objects.

A leaf package: it imports nothing else of the gateway. Errors name the file, the line and the
dotted path of the offending value, and all of them are reported at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.config import auth as auth_section
from gateway.config import backend_auth as backend_auth_section
from gateway.config import cluster as cluster_section
from gateway.config import http as http_sections
from gateway.config import keys, resilience
from gateway.config import limits as limit_sections
from gateway.config import policy as policy_sections
from gateway.config import roots as root_sections
from gateway.config.access import PolicyConfig, PolicyRule, PolicyTarget, PolicyWhen
from gateway.config.checks import missing_commands
from gateway.config.credentials import (
    ApiKey,
    AuthConfig,
    BackendAuth,
    ClusterConfig,
    Introspection,
    redacted_url,
)
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
    _NAME,
    _REDACT_PATH,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_STDIO_CONNECT_TIMEOUT,
    ERAS,
    FAILURE_POLICIES,
    ISOLATIONS,
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


def _backend(c: _Check, name: str, raw: Any, base: Path) -> BackendConfig | None:
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
        namespace=namespace,
        allow_tools=c.field(tools, path + ("tools",), "allow", tt["allow"]),
        deny_tools=c.field(tools, path + ("tools",), "deny", tt["deny"]),
        rename_tools=c.field(body, path, "rename", t["rename"]),
        forward_unknown=c.field(body, path, "forward_unknown", t["forward_unknown"]),
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
        backend = _backend(check, name, body, base)
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
    _check_backend_names(reader, backends)
    namespacing = _namespacing(check, top.get("namespacing"))
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
        task_key_file=_task_key_file(check, top.get("tasks"), source),
    )
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
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark:
        problem += f" ({context} that starts at {context_mark.line + 1}:{context_mark.column + 1})"
    return f"{where}: not valid YAML: {problem}"


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


def describe(config: Config) -> str:
    """A human summary of what `run` would start, for `check-config`."""
    lines = [f"config {config.source}: OK"]
    if config.listen.http is not None:
        h = config.listen.http
        lines.append(f"  listen http  {h.scheme}://{h.host}:{h.port}{h.path}")
    if config.listen.stdio:
        who = config.listen.stdio_identity
        lines.append("  listen stdio" + (f" (as {who.subject})" if who is not None else ""))
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
        era = "" if b.era == "auto" else f" (era {b.era})"
        if isinstance(b.target, StdioTarget):
            cmd = " ".join([b.target.command, *b.target.args])
            each = (
                f" (a child per session, at most {b.max_children}, idle {b.child_idle_timeout:g}s)"
                if b.isolation == "per_session"
                else ""
            )
            lines.append(f"  backend {b.name}: stdio `{cmd}`{era}{each}")
        else:
            kind = "sse" if isinstance(b.target, SseTarget) else "http"
            where = b.target.url
            if isinstance(b.target, HttpTarget) and b.target.urls:
                where = f"{' '.join(map(redacted_url, b.target.urls))} ({b.target.balance})"
            lines.append(f"  backend {b.name}: {kind} {where}{era}")
        if b.roots:
            lines.append(f"  backend {b.name}: roots {' '.join(r.uri for r in b.roots)}")
    t = config.telemetry
    lines.append(
        f"  telemetry    service={t.service_name} traces={t.otlp_endpoint or 'off'}"
        f" access log={t.access_log or 'off'}"
        f" payloads on spans={'yes' if t.record_payloads else 'no'}"
    )
    if config.policy is not None:
        p = config.policy
        lines.append(f"  policy       default {p.default}, rules: {len(p.rules)}")
    if config.auth is not None:
        lines.append(_describe_auth(config.auth))
    if config.cluster is not None:
        lines.append(_describe_cluster(config.cluster))
    if config.tap is not None:
        tap = config.tap
        lines.append(
            f"  tap          {tap.path} (rotates at {_mib(tap.max_bytes)}, keeps {tap.backups}"
            f" old; redacts {len(tap.redact)} paths, Authorization, Cookie"
            f"{''.join(', ' + h for h in tap.redact_headers)})"
        )
    lines.extend(_limit_lines(config))
    return "\n".join(lines)


def _limit_lines(config: Config) -> list[str]:
    lines = []
    limits = config.rate_limits
    if limits is not None:
        parts = [
            f"{name} {rate.rate:g}/s burst {rate.burst}"
            for name, rate in (
                ("per caller", limits.per_identity),
                ("per caller and tool", limits.per_tool),
                ("overall", limits.overall),
            )
            if rate is not None
        ]
        parts += [f"tool {name} {r.rate:g}/s burst {r.burst}" for name, r in limits.tools.items()]
        lines.append(f"  rate limits  {'; '.join(parts) or 'none'}")
    if config.audit is not None:
        a = config.audit
        rotation = (
            ""
            if a.path == AUDIT_STDERR
            else f" (rotates at {_mib(a.max_bytes)}, keeps {a.backups} old)"
        )
        arguments = (
            f"with arguments ({len(a.redact)} paths redacted)" if a.include_arguments else ""
        )
        lines.append(f"  audit log    {a.path}{rotation} {arguments or 'without arguments'}")
    return lines


def _describe_auth(auth: AuthConfig) -> str:
    who = [f"issuer {auth.issuer}"] if auth.issuer else []
    if auth.introspection is not None:
        who.append("introspection")
    if auth.api_keys:
        who.append(f"{len(auth.api_keys)} API keys")
    needs = f", requires {' '.join(auth.required_scopes)}" if auth.required_scopes else ""
    return f"  auth         resource {auth.resource} ({', '.join(who)}){needs}"


def _describe_cluster(cluster: ClusterConfig) -> str:
    # How many and from where, never what: this output is pasted into tickets.
    count = len(cluster.secrets)
    where = f" from {cluster.secrets_file}" if cluster.secrets_file else ""
    line = (
        f"  cluster      {count} secret{'s' if count != 1 else ''}{where} (the first signs, "
        "any is accepted): cursors are valid on every replica"
    )
    if cluster.redis is not None:
        # Redacted: the URL may carry Redis's password.
        line += (
            f"\n  cluster      rate limits shared through {redacted_url(cluster.redis)} (each"
            f" check waits {cluster.redis_timeout:g} s at most; unreachable: per replica,"
            f" tried again after {cluster.redis_retry_interval:g} s)"
        )
    return line


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB" if size >= 1024 * 1024 else f"{size} bytes"


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

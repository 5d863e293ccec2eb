"""The config's keys, section by section: what the loader accepts and what the JSON Schema says.

One table, read by both: the loader takes each section's key set (unknown keys) and each plain
scalar's kind, default and bounds from here (`_Check.field`), and `gateway.config.schema` turns
the same table into the schema that `mcp-transparent-gateway schema` prints. A key added here is
therefore known to both; a key read by the loader but missing here is an "unknown key" error in
every test.
Rules across keys (exactly one transport, `per_session` only for stdio, a fixed admin port that
clashes) stay in the loader: the schema is an editor's aid, `check-config` the judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.config import credentials as cred
from gateway.config.model import (
    BALANCE_MODES,
    DEFAULT_ADMIN_PORT,
    DEFAULT_BACKEND_MAX_IN_FLIGHT,
    DEFAULT_BREAKER_COOLDOWN,
    DEFAULT_BREAKER_FAILURES,
    DEFAULT_BREAKER_WINDOW,
    DEFAULT_CHILD_IDLE_TIMEOUT,
    DEFAULT_EJECT_FOR,
    DEFAULT_FAN_OUT_GRACE,
    DEFAULT_FAN_OUT_START_WAIT,
    DEFAULT_HTTP_HOST,
    DEFAULT_HTTP_PATH,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_CHILDREN,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRY_ATTEMPTS,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_RETRY_MAX_BACKOFF,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    ERAS,
    FAILURE_POLICIES,
    ISOLATIONS,
    POLICY_DEFAULTS,
    PREFIX_MODES,
    RULE_EFFECTS,
    BackendLimits,
    ListenerLimits,
    Namespacing,
)
from gateway.config.operations import (
    ACCESS_LOG_STDERR,
    AUDIT_STDERR,
    DEFAULT_AUDIT_BACKUPS,
    DEFAULT_AUDIT_MAX_ARGUMENTS_BYTES,
    DEFAULT_AUDIT_MAX_BYTES,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_QUEUED,
    DEFAULT_OVERLOAD_RETRY_AFTER,
    DEFAULT_PRE_STOP_DELAY,
    DEFAULT_QUEUE_TIMEOUT,
    DEFAULT_RATE_LIMIT_MAX_KEYS,
    DEFAULT_SERVICE_NAME,
    DEFAULT_STDOUT_STALL_TIMEOUT,
    DEFAULT_TAP_BACKUPS,
    DEFAULT_TAP_MAX_BYTES,
    DEFAULT_TAP_MAX_MESSAGE_BYTES,
    JSON_WINDOW,
)

# string: a string; number: a positive number; count: a whole number >= minimum; port: 0-65535;
# boolean; strings: a list of scalars read as strings; string_map: names to scalars read as
# strings; section: a mapping described by SECTIONS[section]; sections: names to such mappings;
# roots: a list of file:// URIs or `root` sections; section_list: a list of such mappings;
# switch: true, false, or such a mapping (meaning on).
Kind = Literal[
    "string",
    "number",
    "count",
    "port",
    "boolean",
    "strings",
    "string_map",
    "section",
    "sections",
    "section_list",
    "roots",
    "switch",
]


@dataclass(frozen=True)
class Key:
    kind: Kind
    doc: str
    default: str | int | float | bool | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # count: the least whole number; number: the least value
    maximum: float | None = None
    pattern: str | None = None  # a string's regular expression (the loader checks it itself)
    section: str | None = None  # section, sections, section_list, switch: the name in SECTIONS
    required: bool = False


_URL = r"^https?://"
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def _listener_limits() -> dict[str, Key]:
    d = ListenerLimits()
    return {
        "max_body_bytes": Key(
            "count", "A larger request body (after decoding) gets 413.", d.max_body_bytes, minimum=1
        ),
        "max_header_bytes": Key(
            "count", "One header line, or the request line.", d.max_header_bytes, minimum=256
        ),
        "max_headers": Key(
            "count", "Header fields per request (trailers count too).", d.max_headers, minimum=8
        ),
        "max_connections": Key(
            "count", "Open client connections; more are closed.", d.max_connections, minimum=1
        ),
        "max_requests_per_connection": Key(
            "count",
            "Requests on one keep-alive connection.",
            d.max_requests_per_connection,
            minimum=1,
        ),
        "idle_timeout": Key(
            "number", "Seconds a keep-alive connection may sit without a request.", d.idle_timeout
        ),
        "header_timeout": Key(
            "number", "Seconds for a new connection's first request head.", d.header_timeout
        ),
        "body_timeout": Key(
            "number", "Seconds for a request body once its head has arrived.", d.body_timeout
        ),
    }


def _backend_limits() -> dict[str, Key]:
    d = BackendLimits()
    return {
        "max_connections": Key(
            "count", "Open connections to this backend.", d.max_connections, minimum=1
        ),
        "idle_timeout": Key(
            "number", "Seconds before an idle pooled connection is closed.", d.idle_timeout
        ),
        "max_reply_bytes": Key(
            "count", "A JSON reply, or all events of one SSE reply.", d.max_reply_bytes, minimum=1
        ),
        "max_event_bytes": Key("count", "One SSE event.", d.max_event_bytes, minimum=1),
        "max_header_bytes": Key("count", "One reply header line.", d.max_header_bytes, minimum=256),
        "max_headers": Key("count", "Header fields per reply.", d.max_headers, minimum=8),
        "max_resumptions": Key(
            "count",
            "Reconnections in a row that bring nothing before a dropped legacy stream is lost.",
            d.max_resumptions,
            minimum=0,
        ),
        "max_resume_delay": Key(
            "number",
            "The longest wait (seconds) before resuming a dropped legacy stream.",
            d.max_resume_delay,
        ),
    }


_PEM = "A PEM file, relative to the config file."

SECTIONS: dict[str, dict[str, Key]] = {
    "config": {
        "listen": Key(
            "section", "The front ends: http, stdio or both, and admin.", section="listen"
        ),
        "backends": Key(
            "sections", "The MCP servers behind the gateway, by name.", section="backend"
        ),
        "backends_from": Key(
            "string", "An mcp.json (mcpServers) whose servers are added as backends."
        ),
        "namespacing": Key("section", "How merged names are prefixed.", section="namespacing"),
        "fan_out": Key(
            "section", "What a merged list does when a backend fails.", section="fan_out"
        ),
        "tap": Key("section", "Record every JSON-RPC message to a JSON-lines file.", section="tap"),
        "telemetry": Key("section", "Traces, access log and service name.", section="telemetry"),
        "policy": Key(
            "section", "Who may see and call which tools, prompts and resources.", section="policy"
        ),
        "rate_limits": Key(
            "section", "Token buckets per caller, per tool and overall.", section="rate_limits"
        ),
        "overload": Key(
            "section",
            "Bounds on client requests in flight; past them a short queue, then 503.",
            section="overload",
        ),
        "shutdown": Key("section", "How the process stops.", section="shutdown"),
        "audit": Key("section", "One JSON line per client request.", section="audit"),
        "auth": Key(
            "section", "Require OAuth bearer tokens (or API keys) on listen.http.", section="auth"
        ),
        "cluster": Key(
            "section",
            "Identical replicas behind a load balancer: the secrets they sign with.",
            section="cluster",
        ),
        "tasks": Key("section", "Task ids of the Tasks extension.", section="tasks"),
    },
    "listen": {
        "http": Key("section", "The Streamable HTTP front end.", section="listen_http"),
        "stdio": Key(
            "switch",
            "Serve MCP on stdin/stdout: true, or a mapping naming the caller's identity.",
            False,
            section="listen_stdio",
        ),
        "admin": Key(
            "section", "/metrics and health on a port of their own (no MCP).", section="admin"
        ),
    },
    "listen_stdio": {
        "identity": Key(
            "section", "Who the stdio caller is, for the policy.", section="stdio_identity"
        ),
    },
    "stdio_identity": {
        "subject": Key("string", "The caller's subject (as a token's `sub`).", required=True),
        "client_id": Key("string", "The caller's client id."),
        "scopes": Key("strings", "The scopes the caller holds."),
        "claims": Key("string_map", "Claims, for rules on claims."),
    },
    "listen_http": {
        "host": Key("string", "Address to bind; loopback checks Host headers.", DEFAULT_HTTP_HOST),
        "port": Key("port", "0 picks a free port.", DEFAULT_HTTP_PORT),
        "path": Key("string", "The MCP endpoint's path.", DEFAULT_HTTP_PATH, pattern="^/"),
        "allowed_origins": Key("strings", "Browser Origins allowed besides loopback ones."),
        "allowed_hosts": Key("strings", "Extra Host names accepted while bound to loopback."),
        "max_body_bytes": Key("count", "Older spelling of limits.max_body_bytes.", minimum=1),
        "session_idle_timeout": Key(
            "number",
            "Seconds a legacy client's session may sit unused.",
            DEFAULT_SESSION_IDLE_TIMEOUT,
        ),
        "limits": Key(
            "section", "What one client may make the listener hold.", section="listener_limits"
        ),
        "tls": Key("section", "Serve https.", section="server_tls"),
    },
    "listener_limits": _listener_limits(),
    "server_tls": {
        "cert_file": Key("string", _PEM, required=True),
        "key_file": Key("string", _PEM, required=True),
    },
    "admin": {
        "host": Key("string", "Address to bind.", DEFAULT_HTTP_HOST),
        "port": Key(
            "port", "Must differ from listen.http.port on the same interface.", DEFAULT_ADMIN_PORT
        ),
    },
    "backend": {
        "stdio": Key("section", "A command the gateway starts.", section="stdio"),
        "http": Key("section", "A Streamable HTTP server.", section="http_target"),
        "sse": Key(
            "section", "A 2024-11-05 HTTP+SSE server (its SSE endpoint).", section="http_target"
        ),
        "era": Key(
            "string", "auto probes; modern or legacy pins the protocol era.", "auto", choices=ERAS
        ),
        "connect_timeout": Key(
            "number",
            "Seconds to connect and answer the first message (default 30 for stdio, 10 for HTTP).",
        ),
        "request_timeout": Key("number", "Seconds one request may take.", DEFAULT_REQUEST_TIMEOUT),
        "start_timeout": Key(
            "number",
            "stdio: seconds a child has from its start to finish its opening; then it is down.",
            DEFAULT_START_TIMEOUT,
        ),
        "namespace": Key(
            "string", "Prefix of this backend's names (default: its name).", pattern=_NAME_PATTERN
        ),
        "tools": Key(
            "section",
            "Which of the backend's tools are offered; any other key names a tool (as the "
            "backend has it) and holds its own settings.",
            section="tools",
        ),
        "retries": Key(
            "section", "Retries of requests that cannot have effects.", section="retries"
        ),
        "breaker": Key(
            "switch",
            "A circuit breaker: true, or a mapping of its settings (default: off).",
            False,
            section="breaker",
        ),
        "rename": Key("string_map", "Tool names, as the backend has them, to the names offered."),
        "forward_unknown": Key(
            "boolean",
            "Under a policy or rate limits, forward names and URIs missing from the catalog.",
            False,
        ),
        "isolation": Key(
            "string", "per_session: a stdio child per client.", "shared", choices=ISOLATIONS
        ),
        "child_idle_timeout": Key(
            "number", "per_session: seconds before an idle child stops.", DEFAULT_CHILD_IDLE_TIMEOUT
        ),
        "max_children": Key(
            "count", "per_session: children at most.", DEFAULT_MAX_CHILDREN, minimum=1
        ),
        "max_in_flight": Key(
            "count",
            "Requests sent to this backend at once (listen streams aside); then overload's queue.",
            DEFAULT_BACKEND_MAX_IN_FLIGHT,
            minimum=1,
        ),
        "roots": Key("roots", "Roots told to a legacy backend when no client's can be asked."),
        "auth": Key(
            "section",
            "How the gateway logs in to this HTTP backend (OAuth).",
            section="backend_auth",
        ),
    },
    "stdio": {
        "command": Key("string", "The program, looked up on PATH.", required=True),
        "args": Key("strings", "Its arguments."),
        "env": Key("string_map", "Variables set for the child."),
        "cwd": Key("string", "Its working directory."),
        "inherit_env": Key(
            "boolean", "Pass the gateway's whole environment, not a safe short list.", False
        ),
    },
    "http_target": {
        "url": Key("string", "An http:// or https:// URL.", pattern=_URL),
        "urls": Key(
            "strings", "Replicas of one server (http only): each an http:// or https:// URL."
        ),
        "balance": Key(
            "string",
            "With urls: how a replica is picked for a request.",
            "round_robin",
            choices=BALANCE_MODES,
        ),
        "eject_for": Key(
            "number", "With urls: seconds a failed replica is skipped.", DEFAULT_EJECT_FOR
        ),
        "headers": Key("string_map", "Headers sent with every request."),
        "tls": Key("section", "How the backend's certificate is checked.", section="client_tls"),
        "limits": Key(
            "section", "What this backend may make the gateway hold.", section="backend_limits"
        ),
    },
    "client_tls": {
        "ca_file": Key("string", _PEM + " Default: the system's trust store."),
        "cert_file": Key("string", _PEM + " A client certificate."),
        "key_file": Key("string", _PEM + " Its key (default: in cert_file)."),
        "verify": Key("boolean", "false accepts any certificate (tests only).", True),
    },
    "backend_limits": _backend_limits(),
    "tools": {
        "allow": Key("strings", "Only these tools (names as the backend has them)."),
        "deny": Key("strings", "All but these tools."),
    },
    "tool": {
        "timeout": Key(
            "number",
            "Seconds its tools/call may go without a reply or a progress notification "
            "(instead of request_timeout).",
        ),
    },
    "retries": {
        "attempts": Key(
            "count",
            "Tries in all of a request that cannot have effects (1: never retried).",
            DEFAULT_RETRY_ATTEMPTS,
            minimum=1,
        ),
        "backoff": Key(
            "number", "Seconds before the first retry, doubling.", DEFAULT_RETRY_BACKOFF
        ),
        "max_backoff": Key("number", "The longest wait between tries.", DEFAULT_RETRY_MAX_BACKOFF),
    },
    "breaker": {
        "failures": Key(
            "count", "Failures within the window that open it.", DEFAULT_BREAKER_FAILURES, minimum=1
        ),
        "window": Key("number", "Seconds the failures are counted over.", DEFAULT_BREAKER_WINDOW),
        "cooldown": Key(
            "number",
            "Seconds open before one probe request is let through.",
            DEFAULT_BREAKER_COOLDOWN,
        ),
    },
    "root": {
        "uri": Key("string", "A file:// URI.", pattern="^file://", required=True),
        "name": Key("string", "A display name."),
    },
    "namespacing": {
        "prefix": Key(
            "string",
            "auto prefixes only when names collide.",
            Namespacing.prefix,
            choices=PREFIX_MODES,
        ),
        "separator": Key(
            "string",
            "Between namespace and name.",
            Namespacing.separator,
            pattern=r"^[A-Za-z0-9_.-]{1,3}$",
        ),
        "max_name_length": Key(
            "number", "Longest name offered.", Namespacing.max_name_length, minimum=16, maximum=128
        ),
    },
    "fan_out": {
        "on_failure": Key(
            "string",
            "fail_open leaves a failed backend out of a merged list.",
            "fail_open",
            choices=FAILURE_POLICIES,
        ),
        "grace": Key(
            "number",
            "Under fail_open, seconds a merged list waits for the backends still out once "
            "another has answered.",
            DEFAULT_FAN_OUT_GRACE,
        ),
        "start_wait": Key(
            "number",
            "Seconds after a backend began starting that a merged list or listen waits for its "
            "first catalog; past it (or once the backend is down) it is left out, and open "
            "listens are told of the change when it arrives.",
            DEFAULT_FAN_OUT_START_WAIT,
            minimum=0,
        ),
    },
    "tap": {
        "path": Key("string", "The JSON-lines file, relative to the config file.", required=True),
        "redact": Key("strings", "Dotted paths into a message (`*` matches one level)."),
        "redact_headers": Key("strings", "Headers redacted besides Authorization and Cookie."),
        "max_bytes": Key("count", "A file rotates at this size.", DEFAULT_TAP_MAX_BYTES, minimum=1),
        "backups": Key("count", "Old files kept.", DEFAULT_TAP_BACKUPS, minimum=0),
        "max_message_bytes": Key(
            "count",
            "A larger message is recorded as its size only.",
            DEFAULT_TAP_MAX_MESSAGE_BYTES,
            minimum=1,
        ),
    },
    "telemetry": {
        "service_name": Key("string", "service.name on traces and metrics.", DEFAULT_SERVICE_NAME),
        "otlp_endpoint": Key(
            "string", "OTLP/HTTP endpoint for traces (off when absent).", pattern=_URL
        ),
        "record_payloads": Key(
            "boolean", "Put message bodies on spans (they may hold secrets).", False
        ),
        "backend_spans": Key(
            "boolean",
            "A CLIENT span for each request forwarded to a backend, beside the client's SERVER"
            " span (off: the SERVER span stands for the whole pass through the gateway).",
            False,
        ),
        "access_log": Key("string", f"{ACCESS_LOG_STDERR!r} or a file path (off when absent)."),
    },
    "policy": {
        "default": Key(
            "string",
            "What a tool, prompt or resource no rule decides gets.",
            "allow",
            choices=POLICY_DEFAULTS,
        ),
        "rules": Key(
            "section_list",
            "Each names one of allow, deny or require; deny wins.",
            section="policy_rule",
        ),
    },
    "policy_rule": {
        "allow": Key(
            "section", "What the rule lets its callers see and call.", section="policy_target"
        ),
        "deny": Key(
            "section",
            "What its callers never see, and get as unknown names.",
            section="policy_target",
        ),
        "require": Key(
            "section",
            "What needs `scopes`: without them, a call gets insufficient_scope.",
            section="policy_target",
        ),
        "scopes": Key("strings", "require: the scopes the caller must hold."),
        "when": Key(
            "section", "Which callers the rule is for (default: all).", section="policy_when"
        ),
    },
    "policy_target": {
        "backends": Key("strings", "Backends by name (default: all)."),
        "tools": Key("strings", "Globs on tool names as the backend has them."),
        "prompts": Key("strings", "Globs on prompt names as the backend has them."),
        "resources": Key(
            "strings", "Globs on resource URIs and templates as the backend has them."
        ),
    },
    "policy_when": {
        "scopes": Key("strings", "The caller holds all of these scopes."),
        "subjects": Key("strings", "The caller's subject is one of these."),
        "clients": Key("strings", "The caller's client id is one of these."),
        "claims": Key("string_map", "Each claim has this value (or, a list claim, holds it)."),
    },
    "rate_limits": {
        "per_identity": Key("section", "Each caller's bucket.", section="rate"),
        "per_tool": Key("section", "Each caller's bucket per tool (tools/call).", section="rate"),
        "overall": Key("section", "One bucket for all callers together.", section="rate"),
        "tools": Key(
            "sections", "per_tool for these tools (names as clients see them).", section="rate"
        ),
        "max_keys": Key(
            "count",
            "Buckets kept per limit; the least recently used is dropped first.",
            DEFAULT_RATE_LIMIT_MAX_KEYS,
            minimum=1,
        ),
    },
    "overload": {
        "max_in_flight": Key(
            "count",
            "Client requests served at once (listen streams aside).",
            DEFAULT_MAX_IN_FLIGHT,
            minimum=1,
        ),
        "max_queued": Key(
            "count",
            "Requests past a bound that wait for a slot (per bound); more get -31004 at once.",
            DEFAULT_MAX_QUEUED,
            minimum=0,
        ),
        "queue_timeout": Key(
            "number",
            f"Seconds a queued request waits before -31004 (below {JSON_WINDOW:g}: an HTTP reply "
            "turns into a stream then, too late for a 503).",
            DEFAULT_QUEUE_TIMEOUT,
        ),
        "retry_after": Key(
            "number",
            "Seconds a refusal tells the client to wait (Retry-After, data.retryAfter).",
            DEFAULT_OVERLOAD_RETRY_AFTER,
        ),
    },
    "shutdown": {
        "pre_stop_delay": Key(
            "number",
            "Seconds after SIGTERM with /readyz 503 and requests still served, before the drain "
            "(the time a load balancer takes to stop sending; 0: none).",
            DEFAULT_PRE_STOP_DELAY,
            minimum=0,
        ),
        "stdout_stall_timeout": Key(
            "number",
            "Seconds the stdio client may read nothing of the last replies at shutdown before "
            "the gateway gives up on it (exit 1).",
            DEFAULT_STDOUT_STALL_TIMEOUT,
        ),
    },
    "rate": {
        "rate": Key("number", "Requests per second, on average.", required=True),
        "burst": Key("count", "Requests at once (default: rate, rounded up).", minimum=1),
    },
    "audit": {
        "path": Key(
            "string",
            f"{AUDIT_STDERR!r} or a JSON-lines file, relative to the config file.",
            required=True,
        ),
        "include_arguments": Key(
            "boolean", "Record tools/call and prompts/get arguments (after redact).", False
        ),
        "redact": Key("strings", "Dotted paths into a request, as the tap's (`*`: one level)."),
        "max_arguments_bytes": Key(
            "count",
            "Longer arguments (encoded) are recorded as their size only.",
            DEFAULT_AUDIT_MAX_ARGUMENTS_BYTES,
            minimum=1,
        ),
        "max_bytes": Key(
            "count", "A file rotates at this size.", DEFAULT_AUDIT_MAX_BYTES, minimum=1
        ),
        "backups": Key("count", "Old files kept.", DEFAULT_AUDIT_BACKUPS, minimum=0),
    },
    "auth": {
        "issuer": Key(
            "string",
            "The authorization server (https, or http on loopback); its metadata is discovered.",
            pattern=_URL,
        ),
        "resource": Key(
            "string",
            "The gateway's canonical URI (RFC 8707), e.g. https://mcp.example.com/mcp.",
            pattern=_URL,
            required=True,
        ),
        "audience": Key("string", "The aud a token must contain (default: resource)."),
        "scopes_supported": Key("strings", "Scopes listed in the protected resource metadata."),
        "required_scopes": Key("strings", "Scopes every token must carry (else 403)."),
        "introspection": Key(
            "section", "RFC 7662 introspection of opaque tokens.", section="introspection"
        ),
        "api_keys": Key(
            "section_list", "Static bearer keys, stored as SHA-256 digests.", section="api_key"
        ),
        "algorithms": Key(
            "strings", "JWT algorithms accepted (asymmetric only; default RS*, PS256, ES*, EdDSA)."
        ),
        "leeway": Key(
            "number", "Seconds of clock skew allowed on exp and nbf.", cred.DEFAULT_AUTH_LEEWAY
        ),
        "jwks_refresh_interval": Key(
            "number",
            "Least seconds between JWKS fetches for an unknown key id.",
            cred.DEFAULT_JWKS_REFRESH_INTERVAL,
        ),
        "jwks_max_age": Key(
            "number", "Seconds before the JWKS is fetched again.", cred.DEFAULT_JWKS_MAX_AGE
        ),
        "fetch_timeout": Key(
            "number",
            "Seconds for one fetch from the authorization server.",
            cred.DEFAULT_AUTH_FETCH_TIMEOUT,
        ),
        "max_response_bytes": Key(
            "count",
            "A larger metadata document, JWKS or introspection answer is refused.",
            cred.DEFAULT_AUTH_MAX_RESPONSE_BYTES,
            minimum=1024,
        ),
        "token_cache_size": Key(
            "count",
            "Verified JWTs remembered until they expire (a repeated token skips the check).",
            cred.DEFAULT_TOKEN_CACHE_SIZE,
            minimum=1,
        ),
        "login_client_id": Key(
            "string",
            "The gateway's client at the issuer, for per-user backend logins: who opens a login "
            "link signs in here first and must be the caller it was made for.",
        ),
        "login_client_secret": Key("string", "Its secret, if it is confidential (use ${VAR})."),
    },
    "backend_auth": {
        "type": Key(
            "string",
            "oauth: a user's login (authorization code + PKCE); client_credentials: a service "
            "account; token_exchange: the caller's token exchanged (RFC 8693).",
            choices=cred.BACKEND_AUTH_TYPES,
            required=True,
        ),
        "client_id": Key(
            "string", "A pre-registered client id (default: CIMD, else dynamic registration)."
        ),
        "client_secret": Key("string", "Its secret (use ${VAR})."),
        "token_endpoint_auth_method": Key(
            "string",
            "How the gateway authenticates at the token endpoint (default: from the server's "
            "metadata).",
            choices=cred.CLIENT_AUTH_METHODS,
        ),
        "client_metadata_url": Key(
            "string",
            "An https URL of the gateway's Client ID Metadata Document, used as its client id "
            "where the authorization server supports it.",
            pattern="^https://",
        ),
        "client_name": Key(
            "string",
            "The name registered (and shown on consent pages).",
            cred.DEFAULT_OAUTH_CLIENT_NAME,
        ),
        "private_key_file": Key(
            "string", "private_key_jwt: the PEM private key that signs client assertions."
        ),
        "signing_algorithm": Key(
            "string",
            "private_key_jwt: the assertion's algorithm.",
            "RS256",
            choices=cred.CLIENT_ASSERTION_ALGORITHMS,
        ),
        "key_id": Key("string", "private_key_jwt: the assertion's kid."),
        "scopes": Key("strings", "Scopes asked for when the server's challenge names none."),
        "per_user": Key(
            "boolean",
            "oauth: each caller logs in with their own account (asked by URL elicitation).",
            False,
        ),
        "open_browser": Key(
            "boolean", "oauth: open the browser for a login (the URL is logged either way).", True
        ),
        "redirect_port": Key(
            "port", "oauth: port of the loopback redirect listener (0: any free port).", 0
        ),
        "authorization_server": Key(
            "string",
            "The issuer to use when the backend's metadata names none (https, or http on "
            "loopback).",
            pattern=_URL,
        ),
        "subject_token_type": Key(
            "string",
            "token_exchange: the type of the caller's token.",
            "urn:ietf:params:oauth:token-type:access_token",
        ),
        "audience": Key("string", "token_exchange: the audience asked for."),
        "max_attempts": Key(
            "count",
            "A refused request is retried after a new token at most this many times.",
            cred.DEFAULT_OAUTH_MAX_ATTEMPTS,
            minimum=1,
        ),
        "refresh_margin": Key(
            "number",
            "Seconds before expiry at which a token is refreshed.",
            cred.DEFAULT_OAUTH_REFRESH_MARGIN,
        ),
        "login_timeout": Key(
            "number",
            "per_user: seconds a login link stays valid.",
            cred.DEFAULT_OAUTH_LOGIN_TIMEOUT,
        ),
        "store": Key(
            "boolean", "Keep tokens on disk ($XDG_STATE_HOME/mcp-gateway) across restarts.", True
        ),
    },
    "introspection": {
        "client_id": Key(
            "string", "The gateway's client id at the authorization server.", required=True
        ),
        "client_secret": Key("string", "Its secret (use ${VAR}).", required=True),
        "cache_ttl": Key(
            "number",
            "Seconds an answer is reused (never past the token's exp).",
            cred.DEFAULT_INTROSPECTION_CACHE_TTL,
        ),
        "cache_size": Key(
            "count", "Answers kept at most.", cred.DEFAULT_INTROSPECTION_CACHE_SIZE, minimum=1
        ),
    },
    "cluster": {
        "secrets": Key(
            "strings",
            "Each at least 32 characters (use ${VAR}); the first signs, all are accepted.",
        ),
        "secrets_file": Key(
            "string",
            "A file with one secret per line, relative to the config file (instead of secrets).",
        ),
        "redis": Key(
            "string",
            "redis://[:PASSWORD@]HOST:PORT/DB (or rediss://): rate limits, legacy sessions and "
            "backend logins shared by the replicas.",
            pattern="^rediss?://",
        ),
        "redis_timeout": Key(
            "number",
            "Seconds a Redis call waits; then own rate limits apply, legacy sessions get 503.",
            cred.DEFAULT_REDIS_TIMEOUT,
        ),
        "redis_retry_interval": Key(
            "number",
            "Seconds Redis is not asked after a failure (own rate limits, legacy sessions 503).",
            cred.DEFAULT_REDIS_RETRY_INTERVAL,
        ),
    },
    "tasks": {
        "key_file": Key(
            "string",
            "The key signing task ids without cluster.secrets, made once (mode 0600); relative "
            "to the config file. Default: $XDG_STATE_HOME/mcp-gateway/task-key.",
        ),
    },
    "api_key": {
        "name": Key(
            "string", "A label (logs, audit, client id).", pattern=_NAME_PATTERN, required=True
        ),
        "sha256": Key(
            "string",
            'Hex SHA-256 of the key: printf %s "$KEY" | sha256sum.',
            pattern="^[0-9a-fA-F]{64}$",
            required=True,
        ),
        "scopes": Key("strings", "The scopes the key carries."),
        "subject": Key("string", "The subject it stands for (default: its name)."),
    },
}

# A backend names exactly one of these (its transport).
TRANSPORTS = ("stdio", "http", "sse")
# Sections whose mappings name exactly one of some keys (the schema's `oneOf`).
ONE_OF: Mapping[str, tuple[str, ...]] = {
    "backend": TRANSPORTS,
    "policy_rule": RULE_EFFECTS,
    "cluster": ("secrets", "secrets_file"),
    "http_target": ("url", "urls"),
}


# Sections whose other keys are names, each holding a section of the kind given (a tool's own
# settings among `tools`' allow and deny).
ENTRIES: Mapping[str, str] = {"tools": "tool"}


def names(section: str) -> set[str]:
    """The keys a section accepts (the loader's unknown-key check)."""
    return set(SECTIONS[section])


def table(section: str) -> Mapping[str, Key]:
    return SECTIONS[section]

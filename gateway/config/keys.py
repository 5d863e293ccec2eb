"""The config's keys, section by section: what the loader accepts and what the JSON Schema says.

Derived, not declared: a section that is one dataclass of the model takes its keys from that
class's fields (`key(...)` metadata, gateway/config/key.py), so a key is declared once, on the
field it fills. Only the sections whose keys are not one dataclass's fields (the file's nesting:
`backend` holds a transport and `tools:` where the model has a Target and tool lists; `fan_out`
fills fields of Config) are still written out here, each key once. The loader takes each section's
key set (unknown keys) and each plain scalar's kind, default and bounds from here
(`_Check.field`), and `gateway.config.schema` turns the same table into the schema that
`mcp-transparent-gateway schema` prints.
Rules across keys (exactly one transport, `per_session` only for stdio, a fixed admin port that
clashes) stay in the loader: the schema is an editor's aid, `check-config` the judge.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config.access import RULE_EFFECTS, PolicyConfig, PolicyRule, PolicyTarget, PolicyWhen
from gateway.config.credentials import ApiKey, AuthConfig, BackendAuth, ClusterConfig, Introspection
from gateway.config.key import Key, keys_of
from gateway.config.listeners import (
    DEFAULT_HTTP_HOST,
    DEFAULT_HTTP_PATH,
    DEFAULT_HTTP_PORT,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    AdminListen,
    ConfiguredIdentity,
    Listen,
    ListenerLimits,
    ServerTls,
)
from gateway.config.model import (
    BackendConfig,
    BackendLimits,
    BreakerSettings,
    ClientTls,
    Config,
    HttpTarget,
    Namespacing,
    RetrySettings,
    Root,
    StdioTarget,
)
from gateway.config.operations import (
    AuditConfig,
    Overload,
    Rate,
    RateLimits,
    Shutdown,
    TapConfig,
    TelemetryConfig,
)

# Keys that fill no field of their own, only nest others: a backend's transport (its Target) and
# its `tools:` (allow, deny, and each tool's own settings).
_TRANSPORT_KEYS = {
    "stdio": Key("section", "A command the gateway starts.", section="stdio"),
    "http": Key("section", "A Streamable HTTP server.", section="http_target"),
    "sse": Key(
        "section", "A 2024-11-05 HTTP+SSE server (its SSE endpoint).", section="http_target"
    ),
}
_TOOLS_KEY = {
    "tools": Key(
        "section",
        "Which of the backend's tools are offered; any other key names a tool (as the "
        "backend has it) and holds its own settings.",
        section="tools",
    ),
}
# A policy rule's effect: each key names its effect and nests its target.
_EFFECT_KEYS = {
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
}


def _placed(
    fields: dict[str, Key], first: dict[str, Key], nested: dict[str, Key], after: str
) -> dict[str, Key]:
    """A section's keys in the file's order: `first`, the fields' keys, `nested` after `after`."""
    out = dict(first)
    for name, k in fields.items():
        out[name] = k
        if name == after:
            out.update(nested)
    return out


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
    "listen": keys_of(Listen),
    "listen_stdio": keys_of(Listen, "listen_stdio"),
    "stdio_identity": keys_of(ConfiguredIdentity),
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
    "listener_limits": keys_of(ListenerLimits),
    "server_tls": keys_of(ServerTls),
    "admin": keys_of(AdminListen),
    "backend": _placed(keys_of(BackendConfig), _TRANSPORT_KEYS, _TOOLS_KEY, after="namespace"),
    "stdio": keys_of(StdioTarget),
    "http_target": keys_of(HttpTarget),
    "client_tls": keys_of(ClientTls),
    "backend_limits": keys_of(BackendLimits),
    "tools": keys_of(BackendConfig, "tools"),
    "tool": keys_of(BackendConfig, "tool"),
    "retries": keys_of(RetrySettings),
    "breaker": keys_of(BreakerSettings),
    "root": keys_of(Root),
    "namespacing": keys_of(Namespacing),
    "fan_out": keys_of(Config, "fan_out"),
    "tap": keys_of(TapConfig),
    "telemetry": keys_of(TelemetryConfig),
    "policy": keys_of(PolicyConfig),
    "policy_rule": {**_EFFECT_KEYS, **keys_of(PolicyRule)},
    "policy_target": keys_of(PolicyTarget),
    "policy_when": keys_of(PolicyWhen),
    "rate_limits": keys_of(RateLimits),
    "overload": keys_of(Overload),
    "shutdown": keys_of(Shutdown),
    "rate": keys_of(Rate),
    "audit": keys_of(AuditConfig),
    "auth": keys_of(AuthConfig),
    "backend_auth": keys_of(BackendAuth),
    "introspection": keys_of(Introspection),
    "cluster": keys_of(ClusterConfig),
    "tasks": keys_of(Config, "tasks"),
    "api_key": keys_of(ApiKey),
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

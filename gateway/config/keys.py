"""The config's keys, section by section, derived: what the loader accepts and what the JSON
Schema says.

Each key is declared once, on the model's field it fills (`key(...)` metadata, see
gateway/config/key.py); each section's table here is read off its dataclass's fields. The only
keys written out here are those that fill no field of their own: keys that only nest others (a
backend's transport and `tools:`, a rule's effect, `fan_out:` and `tasks:`, whose keys fill
Config's fields), `backends_from` (whose servers join `backends`) and the older spelling
`listen.http.max_body_bytes`. The loader takes each section's key set (unknown keys) and each
plain scalar's kind, default and bounds from here (`_Check.field`, `_Check.scalars`), and
`gateway.config.schema` turns the same tables into the schema that `mcp-transparent-gateway
schema` prints.
Rules across keys (exactly one transport, `per_session` only for stdio, a fixed admin port that
clashes) stay in the loader: the schema is an editor's aid, `check-config` the judge.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config.access import (
    ARGUMENT_TESTS,
    RULE_EFFECTS,
    PolicyAnnotations,
    PolicyArgument,
    PolicyConfig,
    PolicyRule,
    PolicyTarget,
    PolicyWhen,
)
from gateway.config.credentials import ApiKey, AuthConfig, BackendAuth, ClusterConfig, Introspection
from gateway.config.hooks import HookConfig
from gateway.config.key import Key, keys_of
from gateway.config.listeners import (
    AdminListen,
    ConfiguredIdentity,
    HttpListen,
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
from gateway.config.pins import BackendPins, PinsConfig
from gateway.config.search import ToolSearchConfig
from gateway.config.virtual import ServerAuth, ServerBackend, ServerConfig

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
# Top-level keys that fill no field of their own: an mcp.json whose servers join `backends`,
# and the sections whose keys fill Config's fields (`at="fan_out.grace"`).
_IMPORT_KEY = {
    "backends_from": Key("string", "An mcp.json (mcpServers) whose servers are added as backends.")
}
_FAN_OUT_KEY = {
    "fan_out": Key("section", "What a merged list does when a backend fails.", section="fan_out")
}
_TASKS_KEY = {"tasks": Key("section", "Task ids of the Tasks extension.", section="tasks")}
# listen.http.max_body_bytes: read into limits.max_body_bytes, for configs written before limits.
_OLD_MAX_BODY_KEY = {
    "max_body_bytes": Key("count", "Older spelling of limits.max_body_bytes.", minimum=1)
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
    fields: dict[str, Key],
    first: Mapping[str, Key] | None = None,
    after: Mapping[str, Mapping[str, Key]] | None = None,
) -> dict[str, Key]:
    """A section's keys in the file's order: `first`, then the fields' keys, each followed by
    the keys placed `after` it."""
    out = dict(first or {})
    for name, k in fields.items():
        out[name] = k
        out.update((after or {}).get(name, {}))
    return out


SECTIONS: dict[str, dict[str, Key]] = {
    "config": _placed(
        keys_of(Config),
        after={"backends": _IMPORT_KEY, "namespacing": _FAN_OUT_KEY, "cluster": _TASKS_KEY},
    ),
    "listen": keys_of(Listen),
    "listen_stdio": keys_of(Listen, "listen_stdio"),
    "stdio_identity": keys_of(ConfiguredIdentity),
    "listen_http": _placed(keys_of(HttpListen), after={"allowed_hosts": _OLD_MAX_BODY_KEY}),
    "listener_limits": keys_of(ListenerLimits),
    "server_tls": keys_of(ServerTls),
    "admin": keys_of(AdminListen),
    "backend": _placed(keys_of(BackendConfig), _TRANSPORT_KEYS, after={"namespace": _TOOLS_KEY}),
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
    "policy_annotations": keys_of(PolicyAnnotations),
    "policy_argument": keys_of(PolicyArgument),
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
    "tool_search": keys_of(ToolSearchConfig),
    "pins": keys_of(PinsConfig),
    "backend_pins": keys_of(BackendPins),
    "hook": keys_of(HookConfig),
    "server": keys_of(ServerConfig),
    "server_backend": keys_of(ServerBackend),
    "server_auth": keys_of(ServerAuth),
}

# A backend names exactly one of these (its transport).
TRANSPORTS = tuple(_TRANSPORT_KEYS)
# Sections whose mappings name exactly one of some keys (the schema's `oneOf`).
ONE_OF: Mapping[str, tuple[str, ...]] = {
    "backend": TRANSPORTS,
    "policy_rule": RULE_EFFECTS,
    "policy_argument": ARGUMENT_TESTS,
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

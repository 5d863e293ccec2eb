"""Per-request `_meta` fields of the modern era (basic/index, `_meta`; basic/versioning)."""

from __future__ import annotations

from typing import Any

from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message

PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
LOG_LEVEL = "io.modelcontextprotocol/logLevel"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
PROGRESS_TOKEN = "progressToken"

MODERN_VERSION = "2026-07-28"
# Methods of the legacy era only: a modern request for one is for an unknown method.
LEGACY_METHODS = frozenset(
    {"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)
# subscriptions/listen (basic/patterns/subscriptions): the acknowledgement, a resource update,
# and each list-change filter flag -> (the capability announcing it, the notification it turns on).
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
RESOURCE_UPDATED = "notifications/resources/updated"
LIST_FLAGS: dict[str, tuple[str, str]] = {
    "toolsListChanged": ("tools", "notifications/tools/list_changed"),
    "promptsListChanged": ("prompts", "notifications/prompts/list_changed"),
    "resourcesListChanged": ("resources", "notifications/resources/list_changed"),
}
# Legacy revisions (an `initialize` handshake), newest first: the gateway speaks each of them to
# legacy clients and backends.
LEGACY_VERSIONS: tuple[str, ...] = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
# Versions the gateway serves to its clients, newest first.
SUPPORTED_VERSIONS: tuple[str, ...] = (MODERN_VERSION,)


def unsupported_version(id_: jsonrpc.RequestId | None, requested: object) -> Message:
    return jsonrpc.error(
        id_,
        codes.UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        {"supported": list(SUPPORTED_VERSIONS), "requested": requested},
    )


def check_request(msg: Message) -> Message | None:
    """The error reply for a request whose `_meta` a modern server must refuse, else None."""
    id_ = msg.get("id")
    params = msg.get("params")  # (jsonrpc.params inlined: on every request)
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        return jsonrpc.error(id_, codes.INVALID_PARAMS, "params._meta is required")
    version = meta.get(PROTOCOL_VERSION)
    if not isinstance(version, str):
        return jsonrpc.error(id_, codes.INVALID_PARAMS, f"_meta[{PROTOCOL_VERSION!r}] is required")
    if version not in SUPPORTED_VERSIONS:
        return unsupported_version(id_, version)
    if not isinstance(meta.get(CLIENT_CAPABILITIES), dict):
        return jsonrpc.error(
            id_, codes.INVALID_PARAMS, f"_meta[{CLIENT_CAPABILITIES!r}] must be an object"
        )
    return None


def is_modern(msg: Message) -> bool:
    """A request that carries the modern per-request `_meta` (its version field)."""
    return PROTOCOL_VERSION in jsonrpc.meta(msg)


def is_legacy_opening(msg: Message) -> bool:
    """A legacy client's `initialize`: where a transport hands over to the legacy wing."""
    return msg.get("method") == "initialize" and not is_modern(msg)


def gateway_meta(client_info: dict[str, Any]) -> dict[str, Any]:
    """The `_meta` the gateway puts on requests it makes on its own behalf."""
    return {
        PROTOCOL_VERSION: MODERN_VERSION,
        CLIENT_INFO: client_info,
        CLIENT_CAPABILITIES: {},
    }

"""Translation between the modern era the engine speaks and a legacy backend's session era
(basic/versioning, Backward Compatibility with Initialization-Based Versions). Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message

# Server-to-client requests and the client capability each needs.
INPUT_METHODS = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


@dataclass
class LegacySession:
    """What a legacy backend's `initialize` result said."""

    version: str
    capabilities: dict[str, Any]
    server_info: dict[str, Any]
    instructions: str | None


def session_from(result: dict[str, Any]) -> LegacySession:
    """The session an `initialize` result opens (its version already checked)."""
    caps, info = result.get("capabilities"), result.get("serverInfo")
    instructions = result.get("instructions")
    return LegacySession(
        str(result.get("protocolVersion")),
        caps if isinstance(caps, dict) else {},
        info if isinstance(info, dict) else {},
        instructions if isinstance(instructions, str) else None,
    )


def to_legacy(msg: Message) -> Message:
    """The request without the modern era's per-request fields (the session carries them)."""
    params = jsonrpc.params(msg)
    out_params = {k: v for k, v in params.items() if k not in ("inputResponses", "requestState")}
    fields = {
        k: v for k, v in jsonrpc.meta(msg).items() if not k.startswith("io.modelcontextprotocol/")
    }
    if fields:
        out_params["_meta"] = fields
    else:
        out_params.pop("_meta", None)
    out = {k: v for k, v in msg.items() if k != "params"}
    if out_params or "params" in msg:
        out["params"] = out_params
    return out


def to_modern(reply: Message, id_: jsonrpc.RequestId) -> Message:
    """A legacy backend's reply as the engine expects it: the client's id, a `resultType`."""
    reply["id"] = id_
    result = reply.get("result")
    if isinstance(result, dict) and "resultType" not in result:
        jsonrpc.changed(reply)
        result["resultType"] = "complete"
    return reply


def required_capability(capability: str, params: dict[str, Any]) -> dict[str, Any]:
    """The `requiredCapabilities` of a question the client cannot answer."""
    if capability == "elicitation":
        return {"elicitation": {params.get("mode") if params.get("mode") == "url" else "form": {}}}
    return {capability: {}}


def discover_result(session: LegacySession) -> dict[str, Any]:
    """`server/discover` answered from the legacy session's `initialize` result."""
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": [meta.MODERN_VERSION],
        "capabilities": session.capabilities,
        "_meta": {meta.SERVER_INFO: session.server_info},
    }
    if session.instructions is not None:
        result["instructions"] = session.instructions
    return result


def capability(caps: dict[str, Any], name: str, feature: str) -> bool:
    """Whether a server's capabilities declare `name.feature`."""
    declared = caps.get(name)
    return isinstance(declared, dict) and bool(declared.get(feature))

"""A per-user backend's caller who has not logged in yet gets the login link as a URL-mode
elicitation (client/elicitation, URL Mode Elicitation for OAuth Flows) rather than an error;
the client's retry then goes through once they have logged in.

Above the era layer, so a legacy backend's own held calls and sealed `requestState` never see
the gateway's: a retry carrying the gateway's `requestState` has it and the client's answer
removed before it is sent on. A client that cannot open URLs (no `elicitation.url` capability)
gets error -32042 with the link (2025-11-25's URLElicitationRequiredError)."""

from __future__ import annotations

from typing import Any

from gateway.backend_auth.seam import LoginRequired
from gateway.backends.base import Backend, Call, Layer, NotificationSink
from gateway.protocol import meta
from gateway.protocol.jsonrpc import Message

# The gateway's own requestState and input key: nothing a backend would choose.
STATE_PREFIX = "mcp-gateway-login:"
INPUT_KEY = "mcp-gateway-login"
URL_ELICITATION_REQUIRED = -32042


class LoginGate(Layer[Backend]):
    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        params = msg.get("params")
        if isinstance(params, dict) and str(params.get("requestState", "")).startswith(
            STATE_PREFIX
        ):
            params = {
                k: v for k, v in params.items() if k not in ("requestState", "inputResponses")
            }
            msg = {**msg, "params": params}
        try:
            return await self.inner.request(msg, sink, call, long_lived=long_lived)
        except LoginRequired as exc:
            return login_reply(msg, exc)


def login_reply(msg: Message, needed: LoginRequired) -> Message:
    # (elicitationId: a 2025-11-25 client requires it of a URL-mode request, which reaches it
    # through the gateway's legacy front end; a 2026-07-28 client ignores it.)
    elicit = {
        "mode": "url",
        "url": needed.url,
        "message": str(needed),
        "elicitationId": needed.login_id,
    }
    if _opens_urls(msg):
        result: dict[str, Any] = {
            "resultType": "input_required",
            "inputRequests": {INPUT_KEY: {"method": "elicitation/create", "params": elicit}},
            "requestState": STATE_PREFIX + needed.login_id,
        }
        return {"jsonrpc": "2.0", "id": msg.get("id"), "result": result}
    data = {"elicitations": [elicit]}
    error = {"code": URL_ELICITATION_REQUIRED, "message": str(needed), "data": data}
    return {"jsonrpc": "2.0", "id": msg.get("id"), "error": error}


def _opens_urls(msg: Message) -> bool:
    params = msg.get("params")
    found = params.get("_meta") if isinstance(params, dict) else None
    caps = found.get(meta.CLIENT_CAPABILITIES) if isinstance(found, dict) else None
    elicitation = caps.get("elicitation") if isinstance(caps, dict) else None
    return isinstance(elicitation, dict) and "url" in elicitation

"""JSON-RPC and MCP error codes (basic/index, Error Codes)."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

# Our own local failures (backend down, timeout, overload) sit outside the JSON-RPC reserved
# range as the spec asks, so a client can never mistake them for a protocol error of the peer.
BACKEND_UNAVAILABLE = -31001
BACKEND_TIMEOUT = -31002
BACKEND_PROTOCOL_ERROR = -31003
GATEWAY_OVERLOADED = -31004
# The connection to a backend broke after the request may have reached it: not sent again.
BACKEND_CONNECTION_LOST = -31005
# The gateway stopped (SIGINT/SIGTERM, or the end of stdin) while the request still ran, after
# the drain that lets requests finish: its backend call is cancelled.
GATEWAY_SHUTTING_DOWN = -31006
# The caller's token lacks a scope the request needs (HTTP: 403 with an insufficient_scope
# challenge naming the scopes, so a client can step up); `error.data.scope` names them.
INSUFFICIENT_SCOPE = -31007
# The caller is over a rate limit (HTTP: 429 with Retry-After); `error.data.retryAfter` is the
# delay in seconds after which a retry can succeed.
RATE_LIMITED = -31008
# Legacy sessions cannot be read or written: the replicas' shared store (cluster.redis) does
# not answer (HTTP: 503 with Retry-After); `error.data.retryAfter` says when to try again.
SHARED_STATE_UNAVAILABLE = -31009
# A hook refused the request or its result (docs/trusting-tools/hooks.md): the default code of
# a hook's own refusal; a hook may choose another.
HOOK_REFUSED = -31020
# A hook failed (raised, timed out, or answered what a hook may not) and its `on_error` is deny:
# the request is refused rather than let through unchecked.
HOOK_FAILED = -31021
# A result larger than output_limit's `max_result_bytes` (or `max_result_tokens`), refused.
RESULT_TOO_LARGE = -31022

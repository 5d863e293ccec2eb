"""`hooks:` (top level, and each backend's `backends.NAME.hooks`): the Python functions a
request and its result pass through (docs/trusting-tools/hooks.md). One entry names a hook
(`use:` a built-in, an entry point or `module:function`), when it runs, on what, and how long
it may take; the built-ins' own settings sit beside those keys. Read by hook_loader.py."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.key import key

BUILT_INS = ("redact", "output_limit")
STAGES = ("request", "result", "both")
ON_ERROR = ("deny", "allow")
LIMIT_ACTIONS = ("refuse", "truncate")
# The methods a hook may see: the ones a single backend answers about one named thing, whose
# request and result a hook can judge. Lists never pass through hooks (they are fan-outs,
# partly answered from the catalog).
METHODS = ("tools/call", "prompts/get", "resources/read", "completion/complete", "tasks/get")
DEFAULT_METHODS = ("tools/call", "prompts/get")
# A hook is on the request path: a second is long for a function that looks at a message, and
# a minute the most any may be given (the client has its own timeout too).
DEFAULT_TIMEOUT = 1.0
MAX_TIMEOUT = 60.0
DEFAULT_MAX_RESULT_BYTES = 65_536
# The kinds of the redact hook's table (gateway/sensitive.py PATTERNS, which a test holds equal;
# config is a leaf and does not import it).
REDACT_KINDS = (
    "private_key",
    "aws_access_key",
    "aws_secret_key",
    "github_token",
    "slack_token",
    "openai_key",
    "google_api_key",
    "jwt",
    "bearer_token",
    "email",
    "card_number",
)
DEFAULT_MARKER = "\n[truncated by the gateway: {omitted} of {total} bytes left out]"
# `use: module:function` or `use: module.path:object.attribute`; a bare name is a built-in or
# an entry point of the `mcp_gateway.hooks` group.
_USE = re.compile(r"^[A-Za-z_][\w.]*(?::[A-Za-z_][\w.]*)?$")


@dataclass(frozen=True)
class HookConfig:
    use: str = key(
        "string",
        "The hook: redact, output_limit, an entry point (group mcp_gateway.hooks) or "
        "module:function.",
        "",
        shown=None,
        required=True,
    )
    on: str = key(
        "string",
        "When it runs: on the request before the backend, on the result, or both "
        "(default: both; result for the built-ins).",
        "both",
        shown=None,
        choices=STAGES,
    )
    methods: tuple[str, ...] = key(
        "strings",
        f"The methods it sees (default {', '.join(DEFAULT_METHODS)}); of {', '.join(METHODS)}.",
        DEFAULT_METHODS,
    )
    tools: tuple[str, ...] = key(
        "strings",
        "Only tools/call of these tools (globs, names as the backend has them); default all.",
        (),
    )
    timeout: float = key(
        "number",
        f"Seconds it may take; past them it counts as failed (at most {MAX_TIMEOUT:g}).",
        DEFAULT_TIMEOUT,
        maximum=MAX_TIMEOUT,
    )
    on_error: str = key(
        "string",
        "When it raises or times out: deny refuses the request, allow lets it pass unchanged.",
        "deny",
        choices=ON_ERROR,
    )
    options: Mapping[str, str] = key(
        "string_map",
        "Settings handed to a hook of your own (event.options).",
        factory=dict,
        name="with",
    )
    # output_limit
    max_result_bytes: int = key(
        "count",
        "output_limit: the largest result, in bytes of JSON.",
        DEFAULT_MAX_RESULT_BYTES,
        minimum=64,
    )
    max_result_tokens: int | None = key(
        "count",
        "output_limit: the largest result in tokens, estimated as bytes / 4 (the smaller "
        "limit wins).",
        None,
        minimum=16,
    )
    action: str = key(
        "string",
        "output_limit: refuse a result past the limit (-31022), or truncate its text.",
        "refuse",
        choices=LIMIT_ACTIONS,
    )
    marker: str = key(
        "string",
        "output_limit: appended to a truncated text; {omitted}, {total} and {limit} are "
        "replaced by byte counts.",
        DEFAULT_MARKER,
    )
    # redact
    kinds: tuple[str, ...] = key(
        "strings", "redact: the kinds of secret to look for (default: all).", ()
    )
    patterns: Mapping[str, str] = key(
        "string_map", "redact: more kinds, each a regular expression.", factory=dict
    )

    @property
    def stages(self) -> frozenset[str]:
        return frozenset(STAGES[:2]) if self.on == "both" else frozenset({self.on})

    @property
    def limit(self) -> int:
        """output_limit's bytes: the smaller of the byte limit and the token one's estimate."""
        tokens = self.max_result_tokens
        return self.max_result_bytes if tokens is None else min(self.max_result_bytes, tokens * 4)

"""The hook API: what a hook is handed (`HookEvent`) and how it refuses (`Refuse`).

A hook is a function of one `HookEvent`, plain or `async`; it returns None to let the message
pass unchanged, a new dict to change it (the request's new `params`, or the new `result`), and
raises (or returns) `Refuse` to answer the client with a JSON-RPC error of its choosing
(docs/trusting-tools/hooks.md has a worked example). A hook never changes the dicts it is
handed in place: it returns new ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.caller_auth.identity import Identity
from gateway.protocol import codes

Stage = Literal["request", "result"]


@dataclass(frozen=True, slots=True)
class HookEvent:
    """One request, or its result, as a hook sees it.

    `method`, `params`: the request (`params` with the backend's own names: `name` is the tool
    or prompt as the backend has it, whatever the client called it); `result`: at the result
    stage, the backend's result (None at the request stage); `backend`: the backend's name;
    `identity`: the caller (None without authentication, e.g. stdio with no configured one);
    `frontend`: "stdio" or "http"; `options`: the hook's `with:` settings; `raw_size`: at the
    result stage, the bytes of the backend's reply as it came (None when unknown, or once an
    earlier hook changed the result). `audit`: what the hook wants said in its audit line,
    as counts by name (the redact hook's kinds; never a value it saw)."""

    stage: Stage
    method: str
    params: Mapping[str, Any]
    result: Mapping[str, Any] | None
    backend: str
    identity: Identity | None
    frontend: str
    options: Mapping[str, str]
    raw_size: int | None = None
    audit: Counter[str] = field(default_factory=Counter)

    @property
    def name(self) -> str | None:
        """The tool's or prompt's name (the backend's own), or None for other methods."""
        name = self.params.get("name")
        return name if isinstance(name, str) else None


class Refuse(Exception):
    """The hook's answer: the client gets a JSON-RPC error with `code` (default -31020),
    `message` and `data` (JSON) instead of the result, or instead of the backend being asked."""

    def __init__(self, message: str, code: int = codes.HOOK_REFUSED, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.data = data

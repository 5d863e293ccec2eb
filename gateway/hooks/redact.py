"""The `redact` built-in hook: secrets and personal data in results replaced by
`[redacted:KIND]`, with gateway/sensitive.py's table (the kinds in `kinds:`, default all, and
the `patterns:` of the config). Every string of the result is looked at (a tool's text and
structured content, a prompt's messages, a resource's text) but for `_meta` and base64
payloads (`data`, `blob` of a block or resource with a `mimeType`); what was
redacted is counted by kind in the event's audit line, never logged."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gateway.config.hooks import HookConfig
from gateway.hooks.api import HookEvent
from gateway.sensitive import KINDS, Scanner

# Members never scanned: metadata; and in a block with a `mimeType`, its base64 payload (an
# image's or audio's `data`, a resource's `blob`), which no text pattern belongs in.
_META = "_meta"
_PAYLOADS = frozenset({"blob", "data"})


class Redactor:
    """One redact hook: its scanner made once, at load."""

    def __init__(self, config: HookConfig) -> None:
        self.scanner = Scanner(config.kinds or KINDS, config.patterns)

    def __call__(self, event: HookEvent) -> dict[str, Any] | None:
        if event.result is None:
            return None
        counts: Counter[str] = Counter()
        new = _walk(event.result, self.scanner, counts)
        if not counts:
            return None
        event.audit.update(counts)
        return new  # type: ignore[no-any-return]


def _walk(value: Any, scanner: Scanner, counts: Counter[str]) -> Any:
    """`value` with its strings redacted; copies only the containers it changes."""
    if isinstance(value, str):
        before = counts.total()
        out = scanner.redact(value, counts)
        return out if counts.total() != before else value
    if isinstance(value, dict):
        changed: dict[str, Any] | None = None
        payload = "mimeType" in value
        for key, item in value.items():
            if key == _META or (payload and key in _PAYLOADS):
                continue
            new = _walk(item, scanner, counts)
            if new is not item:
                changed = dict(value) if changed is None else changed
                changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        copied: list[Any] | None = None
        for i, item in enumerate(value):
            new = _walk(item, scanner, counts)
            if new is not item:
                copied = list(value) if copied is None else copied
                copied[i] = new
        return value if copied is None else copied
    return value

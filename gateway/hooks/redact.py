"""The `redact` built-in hook: secrets and personal data in results replaced by
`[redacted:KIND]`, with gateway/sensitive.py's table and walk (the tap's too): the kinds in
`kinds:` (default all) and the `patterns:` of the config. Every string of the result is looked
at (a tool's text and structured content, a prompt's messages, a resource's text) but for
`_meta` and base64 payloads (`data`, `blob` of a block or resource with a `mimeType`); what was
redacted is counted by kind in the event's audit line, never logged."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gateway.config.hooks import HookConfig
from gateway.hooks.api import HookEvent
from gateway.sensitive import KINDS, Scanner, redact_values


class Redactor:
    """One redact hook: its scanner made once, at load."""

    def __init__(self, config: HookConfig) -> None:
        self.scanner = Scanner(config.kinds or KINDS, config.patterns)

    def __call__(self, event: HookEvent) -> dict[str, Any] | None:
        if event.result is None:
            return None
        counts: Counter[str] = Counter()
        new = redact_values(event.result, self.scanner, counts)
        if not counts:
            return None
        event.audit.update(counts)
        return new  # type: ignore[no-any-return]

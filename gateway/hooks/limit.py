"""The `output_limit` built-in hook: a result larger than `max_result_bytes` (or than
`max_result_tokens` x 4, a token being about four bytes of JSON) is refused with -31022, or
(`action: truncate`) cut down to the limit.

Its size is the JSON the backend sent (the reply's bytes as received, or the result encoded
when an earlier hook changed it). Truncating keeps the beginning: the texts (a tool's text
blocks, a prompt's text messages, a resource's text contents) are cut from the last one back,
the marker is appended to the last text kept. A tool's `structuredContent` is dropped first:
cut JSON would not match the tool's output schema, and a tool returning it should return its
text form too (server/tools, "Structured Content"), which is what is cut. A result still over
the limit (images, blobs) is refused as with `action: refuse`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.config.hooks import HookConfig
from gateway.hooks.api import HookEvent, Refuse
from gateway.protocol import codes, jsonrpc

# Rounds of cutting: a text's JSON can be longer than its UTF-8 (escapes), so a cut may fall
# short; a second and third look close the gap, and past them the result is refused.
_ROUNDS = 3
# Where a result's texts are: list members whose items are (or hold) text blocks.
_TEXT_LISTS = ("content", "messages", "contents")


class OutputLimit:
    """One output_limit hook."""

    def __init__(self, config: HookConfig) -> None:
        self.limit = config.limit
        self.truncate = config.action == "truncate"
        self.marker = config.marker

    def __call__(self, event: HookEvent) -> dict[str, Any] | None:
        result = event.result
        if result is None:
            return None
        if event.raw_size is not None and event.raw_size <= self.limit:
            return None  # (its reply's bytes bound its result's: no encoding needed)
        size = len(jsonrpc.dumps(result))
        if size <= self.limit:
            return None
        if self.truncate:
            cut = self._cut(result, size)
            if cut is not None:
                event.audit.update({"bytes": size, "limit": self.limit})
                return cut
        event.audit.update({"bytes": size, "limit": self.limit})
        raise Refuse(
            f"result of {size} bytes is over the limit of {self.limit}",
            codes.RESULT_TOO_LARGE,
            {"bytes": size, "limit": self.limit},
        )

    def _cut(self, result: Mapping[str, Any], size: int) -> dict[str, Any] | None:
        """A copy of `result` under the limit, or None if cutting its texts cannot get there."""
        new: dict[str, Any] = jsonrpc.loads(jsonrpc.dumps(result))  # (a copy to cut freely)
        blocks = [b for key in _TEXT_LISTS for b in _text_blocks(new.get(key))]
        if not blocks:
            return None
        marker = self.marker.format(omitted="{omitted}", total=size, limit=self.limit)
        room = len(marker.encode()) + 16  # (and the omitted count's digits)
        omitted = 0
        now = size
        if "structuredContent" in new:
            del new["structuredContent"]
            now = len(jsonrpc.dumps(new))
        for _ in range(_ROUNDS):
            excess = now - self.limit + room
            if excess <= 0:
                break
            for block in reversed(blocks):
                text = block["text"].encode()
                if not text:
                    continue
                keep = max(0, len(text) - excess)
                block["text"] = text[:keep].decode(errors="ignore")
                dropped = len(text) - len(block["text"].encode())
                omitted += dropped
                excess -= dropped
                if excess <= 0:
                    break
            now = len(jsonrpc.dumps(new))
        last = next((b for b in reversed(blocks) if b["text"]), blocks[0])
        last["text"] += marker.replace("{omitted}", str(omitted))
        if len(jsonrpc.dumps(new)) > self.limit:
            return None
        return new


def _text_blocks(items: Any) -> list[dict[str, Any]]:
    """The text blocks among a list's items: an item with a string `text`, or a message whose
    `content` is one."""
    found: list[dict[str, Any]] = []
    if not isinstance(items, list):
        return found
    for item in items:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        block = content if isinstance(content, dict) else item
        if isinstance(block.get("text"), str):
            found.append(block)
    return found

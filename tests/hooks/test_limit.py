"""The `output_limit` hook (gateway/hooks/limit.py): a result past the limit refused with
-31022, or truncated with the marker; a result within it passes."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.hooks import HookConfig
from gateway.hooks.api import HookEvent, Refuse
from gateway.hooks.limit import OutputLimit
from gateway.protocol import codes, jsonrpc


def event(result: dict[str, Any]) -> HookEvent:
    return HookEvent("result", "tools/call", {"name": "t"}, result, "b", None, "stdio", {})


def text_result(*texts: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": t} for t in texts]}


def test_a_result_within_the_limit_passes() -> None:
    limit = OutputLimit(HookConfig(use="output_limit", max_result_bytes=200))
    assert limit(event(text_result("x" * 100))) is None


def test_a_result_past_the_limit_is_refused() -> None:
    limit = OutputLimit(HookConfig(use="output_limit", max_result_bytes=200))
    e = event(text_result("x" * 300))
    with pytest.raises(Refuse) as caught:
        limit(e)
    assert caught.value.code == codes.RESULT_TOO_LARGE
    assert caught.value.data == {"bytes": len(jsonrpc.dumps(e.result)), "limit": 200}


def test_the_token_limit_is_bytes_over_four() -> None:
    limit = OutputLimit(HookConfig(use="output_limit", max_result_tokens=50))
    assert limit.limit == 200
    with pytest.raises(Refuse):
        limit(event(text_result("x" * 300)))


@pytest.mark.parametrize("size", [300, 5_000, 100_000])
def test_truncation_keeps_the_beginning_and_ends_with_the_marker(size: int) -> None:
    limit = OutputLimit(
        HookConfig(
            use="output_limit",
            max_result_bytes=1000,
            action="truncate",
            marker=" [cut {omitted}/{total}]",
        )
    )
    result = text_result("first block", "é" * size, "last " * size)
    new = limit(event(result))
    assert new is not None
    assert len(jsonrpc.dumps(new)) <= 1000
    texts = [b["text"] for b in new["content"]]
    assert texts[0].startswith("first block")
    total = len(jsonrpc.dumps(result))
    assert "".join(texts).endswith(f"/{total}]")
    assert result["content"][1]["text"] == "é" * size  # (the original untouched)


def test_truncation_drops_structured_content_and_cuts_its_text_form() -> None:
    limit = OutputLimit(HookConfig(use="output_limit", max_result_bytes=500, action="truncate"))
    rows = {"rows": ["z" * 100] * 10}
    result = {**text_result(jsonrpc.dumps(rows).decode()), "structuredContent": rows}
    new = limit(event(result))
    assert new is not None and "structuredContent" not in new
    assert new["content"][0]["text"].startswith('{"rows":["zzz')
    assert len(jsonrpc.dumps(new)) <= 500


def test_a_result_without_text_to_cut_is_refused_even_under_truncate() -> None:
    limit = OutputLimit(HookConfig(use="output_limit", max_result_bytes=200, action="truncate"))
    image = {"content": [{"type": "image", "mimeType": "image/png", "data": "A" * 1000}]}
    with pytest.raises(Refuse) as caught:
        limit(event(image))
    assert caught.value.code == codes.RESULT_TOO_LARGE


def test_the_size_of_the_reply_as_received_spares_an_encoding() -> None:
    """Under the limit by its reply's own bytes: passed without encoding the result (a result
    that would be over by encoding is not looked at again)."""
    limit = OutputLimit(HookConfig(use="output_limit", max_result_bytes=200))
    e = HookEvent(
        "result", "tools/call", {}, text_result("x" * 300), "b", None, "stdio", {}, raw_size=150
    )
    assert limit(e) is None

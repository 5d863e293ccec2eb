"""Hooks with the gateway as shipped (docs/trusting-tools/hooks.md): a real gateway process over
HTTP, a real SDK server behind it on a pipe, hooks loaded by path from tests/support/hooks.py
and the two built-ins, each on a tool of its own (`tools:`); a result's text (server/tools,
"Tool Result"; server/prompts, "PromptMessage") seen, changed or refused on its way back; and
the metrics and audit lines they leave."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from mcp import Client

from tests.hooks.test_redact import LOOK_ALIKES, SECRETS
from tests.support import (
    START_BOUND,
    call,
    mirrored_headers,
    request,
    sdk_stdio_command,
    start_gateway_http,
    stdio_backend,
)
from tests.support.hooks import REFUSAL_CODE

pytestmark = [pytest.mark.anyio]

H = "tests.support.hooks"
HOOK_FAILED, RESULT_TOO_LARGE = -31021, -31022
LABEL = "L" * 2000
# Parts apart, so no secret scanner of the repository flags this file: not a live key.
AWS_KEY = "AKIA" + "IOSFODNN7EXAMPLE"
BIG = "start " + "x" * 5000
# Each kind's sample and each look-alike of tests/hooks/test_redact.py, a line each.
EVERY = "\n".join([text for _, text in SECRETS] + LOOK_ALIKES)


def config(tmp_path: Path) -> Path:
    backend = stdio_backend(
        sdk_stdio_command("--label", LABEL),
        hooks=[{"use": f"{H}:raises", "on": "request", "tools": ["add"]}],
    )
    backend["stdio"]["env"] = {"BIG": BIG}  # type: ignore[index]
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": {"sdk": backend},
        "audit": {"path": str(tmp_path / "audit.jsonl")},
        "hooks": [
            {"use": f"{H}:rewrite", "tools": ["echo"]},
            {"use": "redact", "tools": ["echo"]},
            {"use": "redact", "methods": ["prompts/get"]},
            {
                "use": "output_limit",
                "tools": ["getenv"],
                "max_result_bytes": 300,
                "action": "truncate",
            },
            {"use": "output_limit", "tools": ["label"], "max_result_bytes": 300},
            {"use": f"{H}:refuse", "on": "request", "tools": ["boom"]},
            {"use": f"{H}:hang", "on": "request", "tools": ["slow"], "timeout": 0.3},
            {
                "use": f"{H}:hang",
                "on": "request",
                "tools": ["whoami"],
                "timeout": 0.3,
                "on_error": "allow",
            },
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def post(http: aiohttp.ClientSession, url: str, msg: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
        reply: dict[str, Any] = orjson.loads(await resp.read())
    return reply


def text(reply: dict[str, Any]) -> str:
    return "".join(b["text"] for b in reply["result"]["content"] if b["type"] == "text")


async def test_hooks_see_change_and_refuse_results_over_real_processes(tmp_path: Path) -> None:
    proc, url = await anyio.to_thread.run_sync(start_gateway_http, config(tmp_path))
    try:
        await anyio.to_thread.run_sync(proc.wait_for, r"catalog of sdk: \d+ tools")
        with anyio.fail_after(START_BOUND):
            async with aiohttp.ClientSession() as http:
                said = f"mail jane@example.com key {AWS_KEY} order 4111111111111112"
                echo = await post(http, url, call(1, "echo", text=said))
                prompt = await post(
                    http,
                    url,
                    request(
                        2,
                        "prompts/get",
                        {"name": "greet", "arguments": {"name": "bob@example.org"}},
                    ),
                )
                every = await post(
                    http,
                    url,
                    request(20, "prompts/get", {"name": "farewell", "arguments": {"name": EVERY}}),
                )
                cut = await post(http, url, call(3, "getenv", name="BIG"))
                small = await post(http, url, call(4, "getenv", name="HOME"))
                big = await post(http, url, call(5, "label"))
                refused = await post(http, url, call(6, "boom"))
                hung = await post(http, url, call(7, "slow", seconds=0))
                allowed = await post(http, url, call(8, "whoami"))
                raised = await post(http, url, call(9, "add", a=1, b=2))
                async with http.get(url.replace("/mcp", "/metrics")) as resp:
                    metrics = await resp.text()
            # A legacy client's call takes the same path below the dispatcher: the same hooks.
            async with Client(url, mode="legacy") as legacy:
                old = await legacy.call_tool("echo", {"text": "to ann@example.com"})
    finally:
        proc.stop()
    # rewrite (request: a prefix; result: upper case), then redact: the card-like number
    # failing the Luhn check stays.
    assert (
        text(echo)
        == "HOOKED: MAIL [redacted:email] KEY [redacted:aws_access_key] ORDER 4111111111111112"
    )
    message = prompt["result"]["messages"][0]["content"]["text"]
    assert message == "Hello, [redacted:email]!"
    # Every kind over the real pipe, and each look-alike left as it was.
    farewell = every["result"]["messages"][0]["content"]["text"]
    for kind, _ in SECRETS:
        assert f"[redacted:{kind}]" in farewell
    for alike in LOOK_ALIKES:
        assert alike in farewell
    assert [b.text for b in old.content] == ["HOOKED: TO [redacted:email]"]  # type: ignore[union-attr]
    assert text(cut).startswith("start xxx") and len(orjson.dumps(cut["result"])) <= 300
    assert "[truncated by the gateway: " in text(cut)
    assert "result" in small and "truncated" not in text(small)
    assert big["error"]["code"] == RESULT_TOO_LARGE and big["error"]["data"]["limit"] == 300
    assert refused["error"]["code"] == REFUSAL_CODE
    assert hung["error"]["code"] == HOOK_FAILED
    assert text(allowed).isdigit()  # (the hook timed out; on_error: allow let it through)
    assert raised["error"]["code"] == HOOK_FAILED
    for line in (
        'mcp_gateway_hook_outcomes_total{hook="redact",outcome="changed"} 3.0',
        f'mcp_gateway_hook_outcomes_total{{hook="{H}:rewrite",outcome="changed"}} 2.0',
        'mcp_gateway_hook_outcomes_total{hook="output_limit",outcome="refused"} 1.0',
        f'mcp_gateway_hook_outcomes_total{{hook="{H}:hang",outcome="timeout"}} 2.0',
        f'mcp_gateway_hook_outcomes_total{{hook="{H}:raises",outcome="error"}} 1.0',
    ):
        assert line in metrics
    audit = [orjson.loads(line) for line in (tmp_path / "audit.jsonl").read_bytes().splitlines()]
    hooks = [a for a in audit if a.get("event") == "hook"]
    redactions = [a for a in hooks if a["hook"] == "redact"]
    # (echo's result holds its text twice: a text block and structuredContent; the last is the
    # legacy client's)
    assert [a["details"] for a in redactions] == [
        {"email": 2, "aws_access_key": 2},
        {"email": 1},
        dict(Counter(kind for kind, _ in SECRETS)),
        {"email": 2},
    ]
    assert {a["name"] for a in hooks if a["refused"]} == {"label", "boom", "slow", "add"}
    raw = (tmp_path / "audit.jsonl").read_text()
    assert "jane@example.com" not in raw and AWS_KEY not in raw  # (counted, never written)

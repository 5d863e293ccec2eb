"""Hooks of the tests' own, loaded by path (`use: "tests.support.hooks:NAME"`) by gateways the
tests start, and called directly by the in-memory tests (docs/trusting-tools/hooks.md)."""

from __future__ import annotations

import threading
from typing import Any

import anyio

from gateway.hooks import HookEvent, Refuse

# The code `refuse` answers with (a hook's own choice, outside the reserved range).
REFUSAL_CODE = -32050
# Never set: what `hang_in_thread` waits on (its thread is abandoned at the timeout).
_NEVER = threading.Event()


def refuse(event: HookEvent) -> None:
    """Refuses every request whose caller is not "alice" (and, without one, every request)."""
    who = event.identity.subject if event.identity is not None else None
    if who != "alice":
        raise Refuse("only alice may", REFUSAL_CODE, {"subject": who})


def rewrite(event: HookEvent) -> dict[str, Any] | None:
    """Request: an echo's text gains a prefix; result: every text block is upper-cased."""
    if event.stage == "request":
        arguments = dict(event.params.get("arguments") or {})
        if "text" in arguments:
            arguments["text"] = "hooked: " + str(arguments["text"])
        return {**event.params, "arguments": arguments}
    assert event.result is not None
    content = [
        {**block, "text": block["text"].upper()} if block.get("type") == "text" else block
        for block in event.result.get("content", [])
    ]
    return {**event.result, "content": content}


async def hang(event: HookEvent) -> None:
    """Never answers (on the loop): the runner's timeout cancels it."""
    await anyio.sleep_forever()


def hang_in_thread(event: HookEvent) -> None:
    """Never answers (a plain function, in a worker thread): abandoned at the timeout."""
    _NEVER.wait(60)  # (bounded all the same: an abandoned thread ends in a minute)


def raises(event: HookEvent) -> None:
    raise RuntimeError("a hook's bug")


def renames(event: HookEvent) -> dict[str, Any]:
    """Tries to call another tool than the one asked for: a hook may not."""
    return {**event.params, "name": "add"}


def wrong(event: HookEvent) -> str:
    return "not a dict"


def options(event: HookEvent) -> dict[str, Any] | None:
    """Request: the arguments get the hook's `with:` settings as `text`."""
    if event.stage != "request":
        return None
    text = "|".join(f"{k}={v}" for k, v in sorted(event.options.items()))
    return {**event.params, "arguments": {"text": text}}


def same(event: HookEvent) -> Any:
    """Hands back what it was given: a pass, not a change."""
    return event.params if event.stage == "request" else event.result

"""What the `redact` hook costs a result, per KB, in process (bench/README.md "Hooks"): the
hook itself (gateway/hooks/redact.py over gateway/sensitive.py's table) on tools/call results
of 1, 16 and 256 KB of text, clean prose, prose with digits and `@` (the card and e-mail
patterns run), and prose holding a secret of each kind every KB; and, for scale, a request
through `HookedBackend` with the hook against the bare stub. `python -m bench.redact_cost`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from gateway.backends.base import GATEWAY_CALL, Call, NotificationSink
from gateway.config import parse
from gateway.hooks.api import HookEvent
from gateway.hooks.load import load_all
from gateway.hooks.redact import Redactor
from gateway.hooks.runner import HookedBackend
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

ROUNDS = 7
PROSE = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
    "figures and the weather stays mild for the season. "
)
MIXED = "Order 12345 shipped to room 4 on floor 12; contact desk at the front, ext 5550. "
SECRETS = (
    "key AKIA" + "IOSFODNN7EXAMPLE mail ann@example.com card 4111 1111 1111 1111 "
    "token ghp_" + "a1B2" * 9 + " "
)
CONFIG = """
listen: {stdio: true}
backends: {b: {stdio: {command: x}}}
hooks: [{use: redact}]
"""


def text_of(kind: str, size: int) -> str:
    if kind == "secrets":
        unit = SECRETS + PROSE * 6
        return (unit * (size // len(unit) + 1))[:size]
    unit = PROSE if kind == "clean" else PROSE + MIXED + "see bob at example dot com. "
    return (unit * (size // len(unit) + 1))[:size]


def result_of(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def per_kb(redactor: Redactor, result: dict[str, Any], size: int) -> float:
    """Microseconds per KB, the median of ROUNDS rounds of ~0.2 s each."""
    event = HookEvent("result", "tools/call", {"name": "t"}, result, "b", None, "stdio", {})
    runs = max(1, 200_000 // size)
    samples = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(runs):
            event.audit.clear()
            redactor(event)
        samples.append((time.perf_counter() - start) / runs / (size / 1024) * 1e6)
    return statistics.median(samples)


class Stub:
    name = "b"
    transport = "http"
    up = True

    def __init__(self, reply: Message) -> None:
        self.reply = reply

    async def run(self) -> None:
        return None

    async def notify(self, msg: Message) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        return {**self.reply}


async def through(backend: Any, requests: int) -> float:
    msg: Message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {}},
    }

    async def sink(_: Message) -> None:
        return None

    start = time.perf_counter()
    for _ in range(requests):
        await backend.request(msg, sink, GATEWAY_CALL)
    return (time.perf_counter() - start) / requests * 1e6


def main() -> None:
    config = parse(CONFIG)
    redactor = Redactor(config.hooks[0])
    print("redact hook, us per KB of result text (median of 7):")
    print(f"{'text':>10} {'1 KB':>8} {'16 KB':>8} {'256 KB':>8}")
    for kind in ("clean", "mixed", "secrets"):
        row = [per_kb(redactor, result_of(text_of(kind, s * 1024)), s * 1024) for s in (1, 16, 256)]
        print(f"{kind:>10} " + " ".join(f"{v:8.1f}" for v in row))
    reply = {"jsonrpc": "2.0", "id": 1, "result": result_of(text_of("clean", 1024))}
    stub = Stub(reply)
    hooked = HookedBackend(stub, load_all(config.hooks, "hooks"), Stats(), None)
    bare = [asyncio.run(through(stub, 20_000)) for _ in range(ROUNDS)]
    with_hook = [asyncio.run(through(hooked, 20_000)) for _ in range(ROUNDS)]
    print(
        f"a tools/call with a 1 KB clean result: stub alone {statistics.median(bare):.1f} us, "
        f"through HookedBackend + redact {statistics.median(with_hook):.1f} us"
    )


if __name__ == "__main__":
    main()

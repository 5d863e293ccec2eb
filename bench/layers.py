"""What one layer of a backend's stack costs a request, in process: the resilience layer (with
retries on, and with nothing to do) and a bare pass-through `Layer`, each over a stub backend
that answers at once, against the stub alone. `python -m bench.layers` (bench/README.md, issue 32).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

from gateway.backends.base import GATEWAY_CALL, Backend, Call, Layer, NotificationSink
from gateway.backends.resilience import Resilient
from gateway.config import parse
from gateway.config.model import RetrySettings
from gateway.protocol.jsonrpc import Message

REQUESTS = 200_000
ROUNDS = 7
REPLY: Message = {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}
CALL: Message = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "echo", "arguments": {}},
}


class Stub:
    name = "b"
    transport = "http"
    up = True

    async def run(self) -> None:
        return None

    async def notify(self, msg: Message) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        return REPLY


async def _sink(_: Message) -> None:
    return None


async def per_request(backend: Backend, n: int) -> float:
    """Microseconds per request, `n` requests one after another."""
    send = backend.request
    started = time.perf_counter()
    for _ in range(n):
        await send(CALL, _sink, GATEWAY_CALL)
    return (time.perf_counter() - started) / n * 1e6


async def main() -> None:
    (config,) = parse("listen: {stdio: true}\nbackends:\n  b:\n    stdio: {command: x}\n").backends
    idle = dataclasses.replace(config, retries=RetrySettings(attempts=1))
    stub = Stub()
    subjects: dict[str, Backend] = {
        "stub alone": stub,
        "Resilient (defaults: 3 attempts)": Resilient(stub, config),
        "Resilient (attempts 1: left out)": Resilient(stub, idle),
        "bare Layer": Layer(stub),
    }
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(ROUNDS):  # interleaved, so that drift hits every subject alike
        for name, backend in subjects.items():
            times[name].append(await per_request(backend, REQUESTS))
    base = statistics.median(times["stub alone"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:34s} {median:6.3f} µs/request  (+{median - base:.3f} over the stub)")


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())

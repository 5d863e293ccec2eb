"""Resilience per backend: each tool's own timeout, retries of requests that cannot have
effects, and the circuit breaker (breaker.py). One layer, between the backend's health
(health.py) and its instrumentation, so a retried request is one request to the client, its
span and its metrics; a backend known to be down (`BackendDown`) is the health layer's, failed
at once and retried there in the background, and neither retried nor counted here.

- A tool's own timeout (`tools.TOOL.timeout`) is an idle timer: each progress notification of
  the call starts it again. When it runs out the call is cancelled (the transport tells the
  backend, as for its own timeout) and the client gets `BackendTimeout` (-31002). The transport
  is told (on the request's `Call`) to wait up to `CEILING` meanwhile, so a tool may outlast
  request_timeout.
- Retries (`retries:`) only of what cannot have had effects (`safe`), only after a failure
  that says the backend did not answer (`retryable`), with capped exponential backoff and
  jitter, and never past the request's own time (its timeout, counted from the first try).
- The breaker counts failures of any request (`counts`), refuses while open with
  `BreakerOpen` (-31001, naming the backend), and lets one probe through after its cooldown.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

import anyio

from gateway.backends.base import Backend, Call, Layer, NotificationSink
from gateway.backends.breaker import OPEN, Breaker, State
from gateway.config import BackendConfig
from gateway.config.model import RetrySettings
from gateway.errors import (
    BackendConnectionLost,
    BackendDown,
    BackendError,
    BackendLoginNeeded,
    BackendOverloaded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.backend")

# Requests that only read (MCP's lists, reads, discovery, completion, ping): sending one again
# can change nothing on the server.
READS = frozenset(
    {
        "server/discover",
        "ping",
        "tools/list",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "completion/complete",
    }
)
# Each backoff is spread by up to this share either way, so that many callers do not retry in
# step.
JITTER = 0.2
# Tools whose annotations are remembered, at most (a backend's whole list, many times over);
# past it the memory starts afresh, so a server cannot grow it without bound.
MAX_TOOLS = 10_000
# The backstop under a tool's own idle timeout: a day (a call that keeps sending progress may
# run that long; finite because aiohttp and the event loop's timers want a number).
CEILING = 86400.0


class BreakerOpen(BackendDown):
    """The backend's circuit breaker is open: failed at once (it was logged when it opened)."""


def safe_tool(tool: Any) -> bool:
    """A tool (an item of a tools/list result) whose annotations say both that it changes
    nothing and that calling it again has no further effect."""
    annotations = tool.get("annotations") if isinstance(tool, dict) else None
    if not isinstance(annotations, dict):
        return False
    return annotations.get("readOnlyHint") is True and annotations.get("idempotentHint") is True


def safe(msg: Message, safe_tools: Callable[[str], bool]) -> bool:
    """Whether sending the request again can have no effect the first one did not."""
    method = msg.get("method")
    if method in READS:
        return True
    if method != "tools/call":
        return False
    params = msg.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return isinstance(name, str) and safe_tools(name)


def retryable(exc: BackendError) -> bool:
    """A failure after which a safe request may go again: the backend did not answer it (it
    could not be reached, or the connection or child died). Not a timeout (the request's time
    is spent), not a reply that is not MCP, not a JSON-RPC error (an answer, never raised), not
    a backend known down (health.py retries it) or refusing the gateway's credentials."""
    if isinstance(exc, BackendDown | BackendLoginNeeded):
        return False
    return isinstance(exc, BackendUnavailable | BackendConnectionLost)


def counts(exc: BackendError) -> bool | None:
    """What a failure says of the backend's health, for the breaker: False (a failure) when it
    could not answer, timed out or answered with something that is not MCP; None when it says
    nothing (the gateway's own bound, a login, a backend the health layer already has down)."""
    if isinstance(exc, BackendDown | BackendLoginNeeded | BackendOverloaded):
        return None
    if isinstance(
        exc, BackendUnavailable | BackendConnectionLost | BackendTimeout | BackendProtocolError
    ):
        return False
    return None


def backoff(
    retry: int, settings: RetrySettings, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before retry number `retry` (1 for the first): doubling from `backoff`, at most
    `max_backoff`, spread by the jitter."""
    base = min(settings.max_backoff, settings.backoff * float(2 ** min(retry - 1, 16)))
    return min(settings.max_backoff, base * (1 + JITTER * (2 * rand() - 1)))


def needed(config: BackendConfig) -> bool:
    """Whether the layer acts for this backend at all: with no tool timeouts, no retries and no
    breaker every request would pass through it unchanged, so the stack leaves it out."""
    return bool(config.tool_timeouts) or config.retries.attempts > 1 or config.breaker is not None


class Resilient(Layer[Backend]):
    """A backend with its tools' own timeouts, safe retries and its breaker."""

    def __init__(
        self,
        inner: Backend,
        config: BackendConfig,
        breaker: Breaker | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(inner)
        self.breaker = breaker
        self._timeouts = dict(config.tool_timeouts)
        self._request_timeout = config.request_timeout
        self._retries = config.retries
        self._rand = rand
        # What each tool's annotations say (safe_tool), learnt from the tools/list replies that
        # pass through, by the backend's own name.
        self._safe_tools: dict[str, bool] = {}
        if breaker is not None:
            breaker.on_change = self._changed

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        if long_lived:  # (a listen stream: no timeout, never sent again, its own failures)
            return await self.inner.request(msg, sink, call, long_lived=True)
        tool = _tool(msg) if self._timeouts else None
        idle = self._timeouts.get(tool) if tool is not None else None
        started = time.monotonic()  # (anyio's clock on asyncio, without its lookup)
        try:
            if idle is None and self.breaker is None:
                # The first try of the common case in this frame: no breaker, no tool timer.
                reply = await self.inner.request(msg, sink, call)
            else:
                reply = await self._once(msg, sink, call, idle, None)
        except BackendError as exc:
            reply = await self._again(msg, sink, call, exc, idle, started)
        self.passed(msg, reply)
        return reply

    # The steps of `request` for a backend with no tool timeouts and no breaker, also taken by
    # the fused stack (core/fused.py) around its own first try.

    @property
    def plain(self) -> bool:
        """No tool timeouts and no breaker: a first try is the layer below's request as it is."""
        return not self._timeouts and self.breaker is None

    async def retry(
        self, msg: Message, sink: NotificationSink, call: Call, failed: BackendError, started: float
    ) -> Message:
        """After a failed first try (begun at `started`, `time.monotonic()`): the tries after
        it, or `failed` raised."""
        return await self._again(msg, sink, call, failed, None, started)

    def passed(self, msg: Message, reply: Message) -> None:
        """A reply came back: what a tools/list says of its tools' safety, learnt."""
        if msg.get("method") == "tools/list" and self._retries.attempts > 1:
            self._learn(reply)

    async def _again(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        failed: BackendError,
        idle: float | None,
        started: float,
    ) -> Message:
        """The tries after a failed first one, while the error may be retried and the request's
        time lasts; the last failure is raised."""
        budget = idle if idle is not None else self._request_timeout
        tries = 1
        exc = failed
        while True:
            delay = self._retry_after(msg, exc, tries)
            left = budget - (time.monotonic() - started) - (delay or 0.0)
            if delay is None or left <= 0:
                raise exc
            log.debug(
                "backend %s: %s failed (%s); trying again in %.2fs",
                self.name,
                msg.get("method"),
                exc,
                delay,
            )
            await anyio.sleep(delay)
            tries += 1
            try:
                return await self._once(msg, sink, call, idle, None if idle is not None else left)
            except BackendError as next_failure:
                exc = next_failure

    def _retry_after(self, msg: Message, exc: BackendError, tries: int) -> float | None:
        if tries >= self._retries.attempts or not retryable(exc):
            return None
        if not safe(msg, self._safe_tool):
            return None
        return backoff(tries, self._retries, self._rand)

    async def _once(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        idle: float | None,
        within: float | None,
    ) -> Message:
        """One try, through the breaker; `within` overrides the transport's deadline (a retry,
        given what is left of the request's time instead of a fresh timeout)."""
        breaker = self.breaker
        probe = False
        if breaker is not None:
            if not breaker.admit():
                raise BreakerOpen(
                    self.name, f"circuit breaker open; next try in {breaker.retry_in():.1f}s"
                )
            probe = breaker.probing
        outcome: bool | None = None
        try:
            if idle is not None:
                reply = await self._timed(msg, sink, call, idle)
            elif within is not None:
                reply = await self.inner.request(msg, sink, call.within(within))
            else:
                reply = await self.inner.request(msg, sink, call)
            outcome = True
            return reply
        except BackendError as exc:
            outcome = counts(exc)
            raise
        finally:
            if breaker is not None:
                breaker.done(outcome, probe=probe)

    async def _timed(
        self, msg: Message, sink: NotificationSink, call: Call, idle: float
    ) -> Message:
        """The call under its tool's idle timer: each progress notification restarts it."""
        with anyio.CancelScope() as scope:
            scope.deadline = anyio.current_time() + idle

            async def watched(note: Message) -> None:
                if note.get("method") == "notifications/progress":
                    scope.deadline = anyio.current_time() + idle
                await sink(note)

            # The transport waits up to the backstop: this timer decides.
            return await self.inner.request(msg, watched, call.within(CEILING))
        # (The scope ran out: cancelling the request told the backend, as a timeout does.)
        raise BackendTimeout(
            self.name, f"tool {_tool(msg)!r}: no reply or progress within {idle:g}s"
        )

    def _safe_tool(self, name: str) -> bool:
        return self._safe_tools.get(name, False)

    def _learn(self, reply: Message) -> None:
        result = reply.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(tools, list):
            return
        known = self._safe_tools
        if len(known) + len(tools) > MAX_TOOLS:
            known.clear()
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if isinstance(name, str):
                known[name] = safe_tool(tool)

    def _changed(self, state: State) -> None:
        if state == OPEN:
            log.warning(
                "backend %s: circuit breaker open after repeated failures; requests fail at once",
                self.name,
                extra={"backend": self.name, "breaker": state},
            )
        else:
            log.info(
                "backend %s: circuit breaker %s",
                self.name,
                state.replace("_", "-"),
                extra={"backend": self.name, "breaker": state},
            )


def _tool(msg: Message) -> str | None:
    if msg.get("method") != "tools/call":
        return None
    params = msg.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else None

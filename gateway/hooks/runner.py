"""The one place hooks run: `HookedBackend`, the outermost layer of a backend's stack that has
hooks (gateway/app/wiring.py `build_stack`; a backend without any has no such layer).

Order: at the request stage the top-level hooks, then the backend's, each list in the order
written; at the result stage the same order again (a pipeline read top to bottom: `redact`
before `output_limit` redacts, then cuts). A refusal ends the run: later hooks do not see the
message, and a refused request never reaches the backend.

Each hook runs under its `timeout`: an `async` hook on the loop (cancelled at the deadline), a
plain function in a worker thread (abandoned at the deadline: Python cannot stop a thread, so
it runs on, and its answer is dropped), a built-in inline (bounded work over the result, no
waits). A hook that raises, times out or answers what a hook may not has failed: `on_error:
deny` refuses the request with -31021, `allow` lets the message pass unchanged.
"""

from __future__ import annotations

import fnmatch
import inspect
import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.to_thread

from gateway.backends.base import Backend, Call, Layer, NotificationSink
from gateway.config.hooks import HookConfig
from gateway.hooks.api import HookEvent, Refuse, Stage
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.hooks")

HookFunction = Callable[[HookEvent], Any]
# Writes one audit line (gateway/telemetry/audit.py), when the audit log is on.
AuditWriter = Callable[[dict[str, Any]], None]
# What a hook's params may not change: the request's routing (the policy judged the name the
# request came with; a hook renaming it would call a tool the caller may not).
_FIXED = ("name", "uri", "ref")


class Hook:
    """One configured hook, loaded (gateway/hooks/load.py) and ready to run."""

    __slots__ = ("config", "fn", "inline", "is_async", "name", "tools")

    def __init__(self, config: HookConfig, fn: HookFunction, *, inline: bool = False) -> None:
        self.config = config
        self.name = config.use
        self.fn = fn
        self.inline = inline
        call = getattr(fn, "__call__", None)  # noqa: B004  (an async __call__ makes it async)
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)
        globs = config.tools
        self.tools = re.compile("|".join(fnmatch.translate(g) for g in globs)) if globs else None

    def sees(self, stage: Stage, method: str, params: dict[str, Any]) -> bool:
        config = self.config
        if stage not in config.stages or method not in config.methods:
            return False
        if self.tools is None:
            return True
        name = params.get("name")
        return method == "tools/call" and isinstance(name, str) and bool(self.tools.match(name))


class HookedBackend(Layer[Backend]):
    """A backend's requests and results through its hooks (top-level ones first)."""

    def __init__(
        self, inner: Backend, hooks: tuple[Hook, ...], stats: Stats, audit: AuditWriter | None
    ) -> None:
        super().__init__(inner)
        self.hooks = hooks
        self._requests = tuple(h for h in hooks if "request" in h.config.stages)
        self._results = tuple(h for h in hooks if "result" in h.config.stages)
        self._methods = frozenset(m for h in hooks for m in h.config.methods)
        self._stats = stats
        self._audit = audit
        for hook in hooks:  # (listed on /metrics from the start, each at 0)
            stats.hook_outcomes[(hook.name, "pass")] += 0

    def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Coroutine[Any, Any, Message]:
        # A method no hook sees is the inner call itself: no frame of this layer on its path.
        if msg.get("method") not in self._methods:
            return self.inner.request(msg, sink, call, long_lived=long_lived)
        return self._hooked(msg, sink, call, long_lived)

    async def _hooked(
        self, msg: Message, sink: NotificationSink, call: Call, long_lived: bool
    ) -> Message:
        method: str = msg["method"]
        params = jsonrpc.params(msg)
        for hook in self._requests:
            if not hook.sees("request", method, params):
                continue
            value = await self._run(hook, self._event(hook, "request", msg, params, None, call))
            if isinstance(value, Refuse):
                return jsonrpc.error(msg.get("id"), value.code, value.message, value.data)
            if value is not None and value is not params:
                new = dict(value)
                if "_meta" in params and "_meta" not in new:
                    new["_meta"] = params["_meta"]  # (the request's protocol fields stay)
                msg, params = {**msg, "params": new}, new
        reply = await self.inner.request(msg, sink, call, long_lived=long_lived)
        result = reply.get("result")
        if not isinstance(result, dict):
            return reply  # (an error, from the backend or below: no hook judges it)
        changed = False
        for hook in self._results:
            if not hook.sees("result", method, params):
                continue
            size = len(raw) if not changed and (raw := getattr(reply, "raw", None)) else None
            event = self._event(hook, "result", msg, params, result, call, size)
            value = await self._run(hook, event)
            if isinstance(value, Refuse):
                return jsonrpc.error(reply.get("id"), value.code, value.message, value.data)
            if value is not None and value is not result:
                result, changed = value, True
        if changed:
            reply["result"] = result  # (a kept reply forgets its bytes: encoded afresh)
        return reply

    def _event(
        self,
        hook: Hook,
        stage: Stage,
        msg: Message,
        params: dict[str, Any],
        result: dict[str, Any] | None,
        call: Call,
        size: int | None = None,
    ) -> HookEvent:
        origin = call.origin
        return HookEvent(
            stage,
            msg["method"],
            params,
            result,
            self.name,
            origin.identity,
            origin.frontend,
            hook.config.options,
            raw_size=size,
        )

    async def _run(self, hook: Hook, event: HookEvent) -> dict[str, Any] | Refuse | None:
        """What the run comes to: None (pass), a new dict (changed), or a refusal; counted,
        and audited unless it passed."""
        config = hook.config
        try:
            if hook.inline:  # (no wait in it: a deadline could not interrupt it anyway)
                value = hook.fn(event)
            else:
                with anyio.fail_after(config.timeout):
                    if hook.is_async:
                        value = await hook.fn(event)
                    else:
                        value = await anyio.to_thread.run_sync(
                            hook.fn, event, abandon_on_cancel=True
                        )
        except Refuse as refusal:
            return self._done(hook, event, "refused", refusal)
        except TimeoutError:
            return self._failed(hook, event, "timeout", f"took over {config.timeout:g} s")
        except Exception as exc:  # (a hook is the operator's code: any failure is a failure)
            return self._failed(hook, event, "error", f"raised {type(exc).__name__}")
        if value is None:
            return self._done(hook, event, "pass", None)
        if isinstance(value, Refuse):
            return self._done(hook, event, "refused", value)
        if not isinstance(value, dict):
            return self._failed(hook, event, "error", f"returned a {type(value).__name__}")
        if event.stage == "request" and any(value.get(k) != event.params.get(k) for k in _FIXED):
            return self._failed(hook, event, "error", "changed what the request is about")
        unchanged = value is event.result or value is event.params
        return self._done(hook, event, "pass" if unchanged else "changed", value)

    def _failed(
        self, hook: Hook, event: HookEvent, outcome: str, why: str
    ) -> dict[str, Any] | Refuse | None:
        """A failed hook: the request refused (`on_error: deny`) or let through unchanged."""
        deny = hook.config.on_error == "deny"
        # One line per failure, naming the hook and what it did, never the message it saw.
        log.warning(
            "hook %s %s on %s of %s %s; %s",
            hook.name,
            why,
            event.method,
            self.name,
            event.stage,
            "refused" if deny else "let through (on_error: allow)",
        )
        verdict = Refuse(f"hook {hook.name} failed", codes.HOOK_FAILED) if deny else None
        return self._done(hook, event, outcome, verdict)

    def _done(
        self, hook: Hook, event: HookEvent, outcome: str, value: dict[str, Any] | Refuse | None
    ) -> dict[str, Any] | Refuse | None:
        self._stats.hook_outcomes[(hook.name, outcome)] += 1
        if outcome != "pass" and self._audit is not None:
            self._audit(self._audit_line(hook, event, outcome, value))
        return value

    def _audit_line(
        self, hook: Hook, event: HookEvent, outcome: str, value: dict[str, Any] | Refuse | None
    ) -> dict[str, Any]:
        identity = event.identity
        line: dict[str, Any] = {
            "event": "hook",
            "hook": hook.name,
            "stage": event.stage,
            "outcome": outcome,
            "refused": isinstance(value, Refuse),
            "code": value.code if isinstance(value, Refuse) else None,
            "frontend": event.frontend,
            "subject": identity.subject if identity is not None else None,
            "client_id": identity.client_id if identity is not None else None,
            "method": event.method,
            "name": event.name,
            "backend": self.name,
        }
        if event.audit:
            line["details"] = dict(event.audit)  # (counts by kind; never a value seen)
        return line

"""Tasks extension (`io.modelcontextprotocol/tasks`) through a merged gateway.

A backend's CreateTaskResult reaches the client with its `taskId` sealed (routing/taskids.py);
`tasks/get|update|cancel` are unsealed, judged as the `tools/call` that created the task (policy,
rate limits, the creator's identity) and forwarded to that backend under its own id; replies
carry the client's id again. Everything else in them (input requests and responses, the result)
passes as it is, but for a completed result's URIs, shown as a `tools/call` reply's are.

The gateway is transparent (ids pass as they are) where it rewrites nothing and judges nobody:
one backend, no prefixes, no policy, no rate limits and a caller without identity. An id it
sealed is still recognised then (a reload made it transparent).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gateway import errors
from gateway.backends.base import Backend, Call, NotificationSink
from gateway.caller_auth.identity import Identity
from gateway.core.catalog import Catalogs
from gateway.core.policy import TOOL, View
from gateway.core.ratelimit import RateLimiter, SharedRateLimiter
from gateway.errors import InsufficientScope, Refused
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.routing import table as routes
from gateway.routing import taskids
from gateway.routing.names import Naming
from gateway.routing.table import Route
from gateway.routing.taskids import TaskRef
from gateway.telemetry.api import Telemetry

log = logging.getLogger("gateway")

METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
NOTIFICATION = "notifications/tasks"
TASK = "task"  # the `resultType` of a CreateTaskResult
# (backend, the backend's own task id) for a client's id on a listen; None: left out.
Locate = Callable[[object], tuple[str, str] | None]


class Host(Protocol):
    """What of the dispatcher the router reads (always the current one: reloads replace it)."""

    backends: dict[str, Backend]
    catalogs: Catalogs
    telemetry: Telemetry
    limiter: RateLimiter | None
    shared_limiter: SharedRateLimiter | None

    @property
    def policed(self) -> bool: ...


class TaskRouter:
    def __init__(self, host: Host, keys: Sequence[bytes] | Callable[[], bytes]) -> None:
        """`keys`: the signing key first, then those still accepted (taskids.PURPOSE); or
        how to get the one key, called when a task id is first sealed or read (a key file:
        a gateway whose backends make no tasks never touches it)."""
        self._host = host
        # A virtual server seals every task id: a transparent one would be valid on another
        # server offering the same backend.
        self.always_seal = False
        # Whether it tells the rate limiters how to read its task ids: not a virtual server's
        # over the merged server's limiters, which read the merged server's.
        self.attaches = True
        self._keys = tuple(keys) if not callable(keys) else None
        self._load = keys if callable(keys) else None

    @property
    def keys(self) -> tuple[bytes, ...]:
        if self._keys is None:
            assert self._load is not None
            self._keys = (self._load(),)
        return self._keys

    def attach(self, limiter: RateLimiter | None, shared: SharedRateLimiter | None) -> None:
        """Rate limits count a task method against the tool that created the task."""
        if not self.attaches:
            return
        for found in (limiter, shared.local if shared is not None else None):
            if found is not None:
                found.task_tool = self.tool_of

    def transparent(self, identity: Identity | None) -> bool:
        host = self._host
        return (
            not self.always_seal
            and identity is None
            and len(host.backends) == 1
            and not host.catalogs.table.naming.prefixed
            and not host.policed
            and host.limiter is None
            and host.shared_limiter is None
        )

    # --- tools/call replies --------------------------------------------------------------------

    def created(
        self, reply: Message, route: Route, tool: object, identity: Identity | None
    ) -> Message:
        """A tools/call reply, its task id sealed if it created a task (a dict lookup or two
        for any other reply)."""
        result = reply.get("result")
        if not isinstance(result, dict) or result.get("resultType") != TASK:
            return reply
        if self.transparent(identity) or not isinstance(tool, str):
            return reply
        own = result.get("taskId")
        if not isinstance(own, str) or len(own) > taskids.MAX_BACKEND_ID:
            problem = "no string taskId" if not isinstance(own, str) else "a taskId too long"
            log.warning("backend %s created a task with %s", route.backend, problem)
            exc = errors.BackendProtocolError(route.backend, f"created a task with {problem}")
            return errors.to_wire(exc, reply.get("id"))
        key = self.keys[0]
        caller = taskids.caller_digest(identity.key() if identity is not None else None, key)
        ref = TaskRef(route.backend, own, tool, route.name, caller)
        result["taskId"] = taskids.seal(ref, key)
        jsonrpc.changed(reply)
        return reply

    # --- tasks/get, tasks/update, tasks/cancel -------------------------------------------------

    def tool_of(self, msg: Message) -> str | None:
        """The client-visible tool that created the task a request is about (rate limits)."""
        found = taskids.unseal(jsonrpc.params(msg).get("taskId"), self.keys)
        return found[0].tool if found is not None else None

    def locate(self, task_id: object, identity: Identity | None, view: View | None) -> TaskRef:
        """The task a client's id names, if this caller may use it; else refused exactly as an
        unknown task (another caller's, a forged one, one whose tool the caller may no longer
        call: nothing tells them apart), or with the scopes the tool needs."""
        found = taskids.unseal(task_id, self.keys)
        if found is None:
            raise _unknown()
        ref, key = found
        if ref.caller is not None:
            mine = taskids.caller_digest(identity.key() if identity is not None else None, key)
            if mine != ref.caller:
                raise _unknown()
        if ref.backend not in self._host.backends:
            raise _unknown()  # a reload removed its backend
        if view is not None:
            verdict = view.decide(TOOL, ref.backend, ref.own_tool)
            if not verdict.allowed:
                stats = self._host.telemetry.stats
                if verdict.needs:
                    stats.policy_denials["insufficient_scope"] += 1
                    needed = " ".join(sorted(verdict.needs))
                    raise InsufficientScope(verdict.needs, f"The task's tool needs scope {needed}")
                stats.policy_denials["denied"] += 1
                raise _unknown()
        return ref

    async def forward(
        self, msg: Message, sink: NotificationSink, call: Call, view: View | None
    ) -> Message:
        host = self._host
        identity = call.origin.identity
        params = jsonrpc.params(msg)
        client_id = params.get("taskId")
        if self.transparent(identity) and taskids.unseal(client_id, self.keys) is None:
            only = next(iter(host.backends.values()))
            call.observation.annotate(backend=only.name)
            return await only.request(msg, sink, call)
        ref = self.locate(client_id, identity, view)
        table = host.catalogs.table
        listed = table.tools.get(ref.tool)
        target = ref.tool if listed is not None and listed.listed else None
        call.observation.annotate(target=target, backend=ref.backend)
        exposure = table.exposures.get(ref.backend)
        out = {**msg, "params": {**params, "taskId": ref.task_id}}
        reply = await host.backends[ref.backend].request(out, sink, call)
        result = reply.get("result")
        if isinstance(result, dict):
            show(result, client_id, table.naming, exposure)
            jsonrpc.changed(reply)
        return reply

    # --- listens -------------------------------------------------------------------------------

    def locator(self, identity: Identity | None, view: View | None) -> Locate:
        """A listen's `taskIds` as its backends know them; an id the caller may not use is left
        out as an unknown one (the acknowledgement does not list it)."""

        def locate(task_id: object) -> tuple[str, str] | None:
            if self.transparent(identity) and taskids.unseal(task_id, self.keys) is None:
                if not isinstance(task_id, str):
                    return None
                return next(iter(self._host.backends)), task_id
            try:
                ref = self.locate(task_id, identity, view)
            except Refused:
                return None
            return ref.backend, ref.task_id

        return locate


def show(
    task: dict[str, Any], client_id: object, naming: Naming, exposure: routes.Exposure | None
) -> None:
    """A backend's task (a tasks/get result, a notifications/tasks' params) as the client
    knows it, in place: its id the client's, its result's URIs exposed."""
    if "taskId" in task:
        task["taskId"] = client_id
    inner = task.get("result")
    if naming.prefixed and exposure is not None and isinstance(inner, dict):
        routes.expose_content_uris(naming, exposure, inner.get("content"))


def _unknown() -> Refused:
    return Refused(codes.INVALID_PARAMS, "Unknown task", "unknown_task")

"""The engine: checks a request's protocol fields, answers what the gateway owns (discovery,
merged lists), routes the rest to the backend that owns the name, and turns every failure into a
JSON-RPC error (via `errors`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from gateway import errors
from gateway.backends.base import GATEWAY_CALL, Backend, Call, NotificationSink
from gateway.caller_auth.identity import Identity
from gateway.config.model import DEFAULT_FAN_OUT_GRACE, DEFAULT_FAN_OUT_START_WAIT
from gateway.core import apps, tasks, unknown
from gateway.core.catalog import Catalogs
from gateway.core.listen import Subscriptions, first_of
from gateway.core.overload import Bound
from gateway.core.policy import (
    ALL_HIDDEN,
    PROMPT,
    RESOURCE,
    TEMPLATE,
    TOOL,
    Policy,
    View,
    hidden_capabilities,
)
from gateway.core.ratelimit import RateLimiter, SharedRateLimiter
from gateway.errors import InsufficientScope, Refused
from gateway.origin import STDIO_ORIGIN, Origin
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.routing import cursor as cursors
from gateway.routing import merge, uris
from gateway.routing import table as routes
from gateway.routing.apps import app_only
from gateway.routing.names import Naming
from gateway.routing.table import Exposure, Route, RouteTable
from gateway.telemetry.api import NoTelemetry, Telemetry, tapped

log = logging.getLogger("gateway")

# Client notifications the gateway consumes itself instead of forwarding.
LOCAL_NOTIFICATIONS = frozenset({"notifications/cancelled"})
# Not counted against the overall bound on requests in flight: a stream as long as its client.
LISTEN = "subscriptions/listen"
FAIL_OPEN = "fail_open"
Finder = Callable[[RouteTable, str], Route | None]
# What the policy judges each list's items as, and by which of their fields.
LIST_KINDS: dict[str, tuple[str, str]] = {
    "tools": (TOOL, "name"),
    "prompts": (PROMPT, "name"),
    "resources": (RESOURCE, "uri"),
    "resourceTemplates": (TEMPLATE, "uriTemplate"),
}


# Where a catalog (routing/table.py CatalogData) keeps each list's items.
CATALOG_FIELDS: dict[str, str] = {
    "tools": "tools",
    "prompts": "prompts",
    "resources": "resources",
    "resourceTemplates": "templates",
}


@dataclass(frozen=True)
class GatewayInfo:
    name: str
    version: str

    def as_implementation(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


class Dispatcher:
    def __init__(
        self,
        backends: Sequence[Backend],
        exposures: Sequence[Exposure],
        naming: Naming,
        info: GatewayInfo,
        on_failure: str = FAIL_OPEN,
        telemetry: Telemetry | None = None,
        policy: Policy | None = None,
        limiter: RateLimiter | None = None,
        shared_limiter: SharedRateLimiter | None = None,
        cursor_keys: Sequence[bytes] = (),
        bound: Bound | None = None,
        grace: float = DEFAULT_FAN_OUT_GRACE,
        start_wait: float = DEFAULT_FAN_OUT_START_WAIT,
        task_keys: Sequence[bytes] | Callable[[], bytes] = (),
    ) -> None:
        self.telemetry: Telemetry = telemetry or NoTelemetry()
        self._policy = policy  # None: every caller may see and call everything
        self.limiter = limiter
        # Instead of `limiter` when replicas share their buckets (cluster.redis).
        self.shared_limiter = shared_limiter
        # Client requests in flight, all front ends together (None: unbounded, for tests).
        self.bound = bound
        self.backends = {b.name: b for b in backends}
        self._order = [b.name for b in backends]
        self._exposures = {e.backend: e for e in exposures}
        self._naming = naming
        self._info = info
        self._fail_open = on_failure == FAIL_OPEN
        self.catalogs = Catalogs(backends, exposures, naming, info.as_implementation(), start_wait)
        # Cursors are signed so a forged one is refused. `cursor_keys` (from cluster.secrets:
        # the signing key first, then older ones still accepted) let a page from one replica
        # continue on another; without them the key is this process's own, and a cursor from
        # another process or from before a restart is stale (the spec lets cursors expire).
        self._cursor_keys: tuple[bytes, ...] = tuple(cursor_keys) or (os.urandom(32),)
        self.fan_out_failures: dict[str, int] = {}
        self._grace = grace
        # Backends skipped by the last fan-out that asked them: logged when they start being
        # skipped, not on every list while they stay so.
        self._skipping: set[str] = set()
        self.subscriptions = Subscriptions(
            self.backends, self.catalogs, self._exposures, naming, grace
        )
        self._notes = unknown.NotificationGate(self.telemetry.stats.rejections)
        # Task ids are sealed (core/tasks.py): keys from cluster.secrets or a key file (app/).
        self.tasks = tasks.TaskRouter(self, task_keys or (os.urandom(32),))
        self.tasks.attach(limiter, shared_limiter)

    def reconfigure(
        self,
        backends: Sequence[Backend],
        exposures: Sequence[Exposure],
        naming: Naming,
        on_failure: str,
        policy: Policy | None,
        limiter: RateLimiter | None,
        shared_limiter: SharedRateLimiter | None = None,
    ) -> list[str]:
        """A reloaded config (gateway/app/ `Gateway.reload`): from now on requests route over these
        backends, names and rules. Synchronous, so no request sees half of it; the maps are
        replaced, not changed, so a fan-out under way keeps the set it began with. Returns the
        backends whose catalogs are to be loaded."""
        self.backends = {b.name: b for b in backends}
        self._order = [b.name for b in backends]
        self._exposures = {e.backend: e for e in exposures}
        self._naming = naming
        self._fail_open = on_failure == FAIL_OPEN
        self._policy = policy
        self.limiter = limiter
        self.shared_limiter = shared_limiter
        self.tasks.attach(limiter, shared_limiter)
        loads = self.catalogs.reconfigure(backends, exposures, naming)
        # After the table: open listens are extended to the added backends by its routes.
        self.subscriptions.reconfigure(self.backends, self._exposures, naming)
        return loads

    def close_streams(self) -> None:
        """Shutdown: every open listen ends with its graceful completion result."""
        self.subscriptions.close_all()

    # --- entry points ----------------------------------------------------------------------

    def handle(
        self, msg: Message, sink: NotificationSink, origin: Origin = STDIO_ORIGIN
    ) -> Coroutine[Any, Any, Message]:
        """The reply to one client request as it came in; never raises except for
        cancellation. The traffic tap records the request, its notifications and its reply
        here (a legacy client's are recorded by `frontends/legacy/front.py`, which then calls
        `serve`). A plain function handing back a coroutine: no frame more while the tap is
        off."""
        if not self.telemetry.tapping:
            return self.serve(msg, sink, origin)
        return self._tapped(msg, sink, origin)

    async def _tapped(self, msg: Message, sink: NotificationSink, origin: Origin) -> Message:
        telemetry = self.telemetry
        telemetry.record("frontend", "in", msg, headers=origin.headers)
        reply = await self.serve(msg, tapped(telemetry, sink, "frontend", "out", None), origin)
        telemetry.record("frontend", "out", reply)
        return reply

    async def serve(
        self, msg: Message, sink: NotificationSink, origin: Origin = STDIO_ORIGIN
    ) -> Message:
        """`handle` without the traffic tap: for requests made in a client's name that are not
        what crossed the client's hop."""
        telemetry = self.telemetry
        observed = telemetry.server(msg, origin)
        call = Call(origin, observed)  # (what its backend requests carry down the stack)
        reply: Message | None = None
        try:
            reply = meta.check_request(msg)
            if reply is not None:
                telemetry.stats.rejections[_rejection_reason(reply)] += 1
            else:
                try:
                    if msg["method"] == "tools/call":
                        # An app view's call by its server's own tool name (core/apps.py).
                        msg = apps.by_visible_name(
                            self.catalogs.table, msg, self._policy, origin.identity
                        )
                    if self.limiter is not None:
                        self.limiter.admit(msg, origin)
                    elif self.shared_limiter is not None:
                        await self.shared_limiter.admit(msg, origin)
                    bound = self.bound
                    if bound is None or msg["method"] == LISTEN:
                        reply = await self._dispatch(msg, sink, call)
                    else:
                        # After the rate limit: a refused request holds no slot. The fast
                        # path is a comparison and an increment (core/overload.py).
                        if bound.busy < bound.limit:
                            bound.busy += 1
                        else:
                            await bound.queue()
                        try:
                            reply = await self._dispatch(msg, sink, call)
                        finally:
                            bound.release()
                except Exception as exc:
                    if isinstance(exc, Refused) and exc.reason is not None:
                        telemetry.stats.rejections[exc.reason] += 1
                    reply = errors.to_wire(exc, msg["id"])
        finally:
            if reply is None:  # cancelled: the client went away (or the gateway is stopping)
                observed.cancel()
            else:
                observed.end(reply)
        return reply

    async def notify(self, msg: Message) -> None:
        """Forward a client notification as it came in; failures are logged, never raised
        (nobody awaits it)."""
        if self.telemetry.tapping:
            self.telemetry.record("frontend", "in", msg)
        await self.pass_on(msg)

    async def pass_on(self, msg: Message) -> None:
        """`notify` without the traffic tap (a legacy client's, translated)."""
        only = self._only_backend()
        if not self.accepts_notification(msg) or msg["method"] in LOCAL_NOTIFICATIONS:
            return  # (a request method is dropped even where nothing would be passed on)
        if only is None:
            return
        try:
            await only.notify(msg)
        except errors.BackendDown as exc:
            log.debug("notification %s not delivered: %s", msg["method"], exc)  # (logged once)
        except errors.BackendError as exc:
            log.warning("notification %s not delivered: %s", msg["method"], exc)

    def accepts_notification(self, msg: Message) -> bool:
        """Whether a client notification may be passed on (core/unknown.py: not one with a
        request's method); one that may not is counted, and the first logged."""
        return self._notes.accepts(msg)

    def backend_notification(self, backend: str, msg: Message) -> None:
        """A notification a backend sent outside any request: a list change makes its catalog
        stale, so the next lookup that misses refetches it (and, with a cluster bus, the other
        replicas hear of it: `Subscriptions.heard`)."""
        if str(msg.get("method", "")).endswith("/list_changed"):
            self.catalogs.invalidate(backend)
        self.subscriptions.heard(backend, msg)

    async def param_headers(
        self, tool: str, identity: Identity | None = None
    ) -> tuple[ParamHeader, ...] | None:
        """The `x-mcp-header` annotations of a client-visible tool, if the tool is known (after
        refreshing stale catalogs: callers look in `catalogs.table` first, without a coroutine)
        and the policy shows it to the caller."""
        route = await self._lookup(RouteTable.tool, tool) or self.catalogs.table.own_tool(tool)
        if route is None or not self.shows_tool(route, identity):
            return None
        return route.param_headers

    @property
    def policed(self) -> bool:
        """Whether a policy decides what callers see and call."""
        return self._policy is not None

    def shows_tool(self, route: Route, identity: Identity | None) -> bool:
        """Whether the policy shows the caller this tool. The HTTP front end checks a call's
        Mcp-Param-* headers only against tools the caller may see: a hidden tool's annotations
        must not make its refusal differ from an unknown tool's."""
        if self._policy is None:
            return True
        return self._policy.view(identity).visible(TOOL, route.backend, route.name)

    # --- dispatch ----------------------------------------------------------------------------

    async def _dispatch(self, msg: Message, sink: NotificationSink, call: Call) -> Message:
        method = msg["method"]
        origin = call.origin
        params = jsonrpc.params(msg)
        # What this caller may see and call (None: no policy, everything).
        view = self._policy.view(origin.identity) if self._policy is not None else None
        if method == "tools/call":
            name = params.get("name")
            # A known tool is found without a coroutine; only a miss may refresh catalogs.
            found = self.catalogs.table.tool(name) if isinstance(name, str) else None
            route = found or await self._route_name(RouteTable.tool, TOOL, name, view, call)
            self._permit(view, TOOL, route, name)
            reply = await self._forward(msg, params, sink, route, "name", call)
            return self.tasks.created(reply, route, name, origin.identity)
        if method in tasks.METHODS:
            return await self.tasks.forward(msg, sink, call, view)
        if method == "server/discover":
            return await self._discover(msg, view, call)
        if method in merge.LIST_KEYS:
            return await self._list(msg, view, call)
        if method == "prompts/get":
            name = params.get("name")
            route = await self._route_name(RouteTable.prompt, PROMPT, name, view, call)
            self._permit(view, PROMPT, route, name)
            return await self._forward(msg, params, sink, route, "name", call)
        if method == "resources/read":
            uri = params.get("uri")
            route = await self._route_uri(uri, view, RESOURCE, call)
            self._permit(view, RESOURCE, route, uri)
            return await self._forward(msg, params, sink, route, "uri", call)
        if method == "completion/complete":
            return await self._complete(msg, sink, view, call)
        if method == "subscriptions/listen":
            # Judged by the policy in force when its parts are planned (a reload may add some).
            judge = functools.partial(self._judge, origin.identity)
            locate = self.tasks.locator(origin.identity, view)
            return await self.subscriptions.listen(msg, sink, call, judge, locate)
        only = self._only_backend()
        if only is None or method in meta.LEGACY_METHODS:
            raise Refused(codes.METHOD_NOT_FOUND, f"Method not found: {method}")
        call.observation.annotate(backend=only.name)
        return await only.request(msg, sink, call)

    def _judge(
        self, identity: Identity | None
    ) -> tuple[Callable[[str, str], bool] | None, Callable[[str], frozenset[str]] | None]:
        """The policy's say on a caller's listen, by the policy in force now: a reload that
        extends the listen judges the added backends by the reloaded rules."""
        if self._policy is None:
            return None, None
        view = self._policy.view(identity)
        return _readable(view), functools.partial(self._hidden_capabilities, view)

    def _only_backend(self) -> Backend | None:
        return self.backends[self._order[0]] if len(self._order) == 1 else None

    async def _lookup(self, find: Finder, key: str, call: Call = GATEWAY_CALL) -> Route | None:
        """Look a name up; on a miss, refresh stale catalogs (in `call`'s trace) and look again."""
        route = find(self.catalogs.table, key)
        if route is None:
            # Only the catalogs the name can be in; not one whose load failed (it is loaded
            # again in the background, and the miss says it is unavailable): a backend that
            # is down or silent holds up no lookup of another's names.
            catalogs = self.catalogs
            owners = [b for b in catalogs.owners(key) if catalogs.problem(b) is None]
            await catalogs.refresh_stale(lambda table: find(table, key) is not None, owners, call)
            route = find(self.catalogs.table, key)
        return route

    @property
    def _guarded(self) -> bool:
        """Whether a policy or rate limits judge names: then what is not in a catalog is not
        forwarded on a guess without `forward_unknown` (core/unknown.py)."""
        return not (self._policy is None and self.limiter is None and self.shared_limiter is None)

    def _missing(self, kind: str, name: str) -> Exception:
        """A name that routes nowhere: unknown, unless a backend it may belong to has no
        catalog because its load failed; then that backend is unavailable (-31001, naming it),
        which a client may retry, where an unknown name it may not."""
        for backend in self.catalogs.owners(name):
            problem = self.catalogs.problem(backend)
            if problem is not None:
                return errors.BackendUnavailable(backend, f"its {kind}s are not known: {problem}")
        return _unknown(kind, name)

    async def _route_name(
        self, find: Finder, kind: str, name: object, view: View | None, call: Call
    ) -> Route:
        if not isinstance(name, str):
            raise Refused(codes.INVALID_PARAMS, f"params.name must name a {kind}")
        route = await self._lookup(find, name, call)
        if route is not None:
            return route
        only = self._only_backend()
        if only is not None and not self._naming.prefixed and self._may_guess(kind, name, view):
            # One unprefixed backend: it answers for itself.
            return Route(only.name, name, listed=False)
        raise self._missing(kind, name)

    def _may_guess(self, kind: str, name: str, view: View | None) -> bool:
        local = self.shared_limiter.local if self.shared_limiter is not None else self.limiter
        limited = local.folded_tools if local is not None else {}
        data, exposure = self.catalogs.data(self._order[0]), self._exposures[self._order[0]]
        return unknown.may_guess_name(kind, name, exposure, self._guarded, view, data, limited)

    def _permit(self, view: View | None, kind: str, route: Route, shown: object) -> None:
        """Refuse what the policy does not let this caller call: a denied name exactly as an
        unknown one (nothing tells the two apart), one that needs scopes the caller lacks with
        those scopes, for a step-up."""
        if view is None:
            return
        if kind in (RESOURCE, TEMPLATE):
            # A URI is also judged as a server may resolve it (an encoded slash taken for one).
            readings = uris.readings(route.name)
            verdict = unknown.judged(view, kind, route.backend, route.name, readings)
        else:
            verdict = view.decide(kind, route.backend, route.name)
        if verdict.allowed:
            return
        noun = "resource" if kind in (RESOURCE, TEMPLATE) else kind
        stats = self.telemetry.stats
        if verdict.needs:
            stats.policy_denials["insufficient_scope"] += 1
            needed = " ".join(sorted(verdict.needs))
            raise InsufficientScope(verdict.needs, f"The {noun} {shown} needs scope {needed}")
        stats.policy_denials["denied"] += 1
        # No rejection reason: the rejection metric counts unknown names, and this one is not.
        raise _unknown(noun, shown, reason=None)

    async def _route_uri(self, uri: object, view: View | None, kind: str, call: Call) -> Route:
        """Where a URI goes. Under a policy or rate limits, by its RFC 3986 normal form (what
        is judged and forwarded: another spelling cannot pass a rule written for the URI), and
        only if a catalog has it or the backend takes unknown URIs (`forward_unknown`)."""
        if not isinstance(uri, str):
            raise Refused(codes.INVALID_PARAMS, "params.uri must be a string")
        if not self._guarded:
            route = await self._lookup(RouteTable.resource, uri, call)
            if route is None:
                raise self._missing("resource", uri)
            return route
        normal = uris.normalize_client(self._naming, uri)
        route = await self._lookup(RouteTable.listed_resource, normal, call)
        if route is not None:
            return route
        guess = self.catalogs.table.resource(normal)
        if guess is None:
            raise self._missing("resource", uri)
        if not unknown.may_guess_uri(kind, guess, self._exposures[guess.backend], view):
            raise _unknown("resource", uri)
        return Route(guess.backend, guess.name, listed=False)

    async def _forward(
        self,
        msg: Message,
        params: dict[str, Any],
        sink: NotificationSink,
        route: Route,
        field: str,
        call: Call,
    ) -> Message:
        """Send a request to its backend under the backend's own name, and show the reply's
        URIs as clients know them."""
        visible = params.get(field)
        # Only listed tool and prompt names become metric labels: their number is bounded.
        target = visible if field == "name" and route.listed else None
        call.observation.annotate(target=target, backend=route.backend)
        out = msg if visible == route.name else {**msg, "params": {**params, field: route.name}}
        # Taken before the request: a reload meanwhile (which lets this request finish) must
        # not change how its reply is shown.
        naming, exposure = self._naming, self._exposures[route.backend]
        reply = await self.backends[route.backend].request(out, sink, call)
        if naming.prefixed:
            routes.expose_reply_uris(naming, exposure, msg["method"], reply)
        return reply

    async def _complete(
        self, msg: Message, sink: NotificationSink, view: View | None, call: Call
    ) -> Message:
        params = jsonrpc.params(msg)
        ref = params.get("ref")
        if not isinstance(ref, dict):
            raise Refused(codes.INVALID_PARAMS, "params.ref is required")
        if ref.get("type") == "ref/prompt":
            route = await self._route_name(RouteTable.prompt, PROMPT, ref.get("name"), view, call)
            self._permit(view, PROMPT, route, ref.get("name"))
            new_ref = {**ref, "name": route.name}
        else:
            route = await self._route_uri(ref.get("uri"), view, TEMPLATE, call)
            self._permit(view, TEMPLATE, route, ref.get("uri"))
            new_ref = {**ref, "uri": route.name}
        out = {**msg, "params": {**params, "ref": new_ref}}
        call.observation.annotate(backend=route.backend)
        return await self.backends[route.backend].request(out, sink, call)

    # --- fan-out -----------------------------------------------------------------------------

    async def _fan_out(
        self,
        calls: Sequence[tuple[str, Message]],
        call: Call,
        *,
        fail_open: bool | None = None,
        late: list[str] | None = None,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Send requests to several backends at once; each answer's result in the same order.

        A failing backend is skipped under fail_open (logged when it starts failing, counted
        every time) and fails the whole request under fail_closed; when every backend fails,
        so does the request. Under fail_open a backend that has not answered `grace` seconds
        after the last answer (fan_out.grace: a silent one, a black hole, a slow one) is
        skipped too, its request cancelled (and named in `late`): one backend never holds the
        others' lists for long. Under fail_closed every answer is awaited (each bounded by its
        backend's request timeout)."""
        open_policy = self._fail_open if fail_open is None else fail_open
        replies: dict[str, Message | Exception] = {}
        targets = self.backends  # the set `calls` was made from, should a reload come first
        progress = [anyio.Event()]  # set (and replaced) at each answer
        answered = 0  # how many answered with a result

        async def one(backend: str, request: Message) -> None:
            nonlocal answered
            try:
                reply = replies[backend] = await targets[backend].request(request, _ignore, call)
                answered += isinstance(reply.get("result"), dict)
            except errors.BackendError as exc:
                replies[backend] = exc
            progress[0].set()
            progress[0] = anyio.Event()

        async with anyio.create_task_group() as tg:
            for backend, request in calls:
                tg.start_soon(one, backend, request)
            if open_policy and len(calls) > 1:
                await self._until_answered(replies, calls, progress, lambda: answered)
                tg.cancel_scope.cancel()  # the stragglers' requests (lists: nothing is lost)
        out: list[tuple[str, dict[str, Any]]] = []
        failed: list[Exception] = []
        for backend, _ in calls:
            reply = replies.get(backend)
            if reply is None:
                if late is not None:
                    late.append(backend)
                reply = errors.BackendTimeout(
                    backend, f"no answer within {self._grace:g}s of the other backends"
                )
            result = reply.get("result") if isinstance(reply, dict) else None
            if isinstance(result, dict):
                out.append((backend, result))
                self._skipping.discard(backend)
                continue
            self.fan_out_failures[backend] = self.fan_out_failures.get(backend, 0) + 1
            if not open_policy:
                raise _as_failure(backend, reply)
            failed.append(_as_failure(backend, reply))
            # A backend known to be down was logged when it went down, and an overloaded one
            # is logged by its bound (at most every 10 s); any other once when it starts being
            # skipped, not on every list while it stays so.
            quiet = isinstance(reply, errors.BackendDown | errors.BackendOverloaded)
            level = logging.DEBUG if quiet or backend in self._skipping else logging.WARNING
            self._skipping.add(backend)
            log.log(level, "fan-out: backend %s skipped: %s", backend, _describe(reply))
        if failed and not out:
            raise failed[0]  # nothing answered: an empty result would hide the outage
        return out

    async def _until_answered(
        self,
        replies: dict[str, Message | Exception],
        calls: Sequence[tuple[str, Message]],
        progress: list[anyio.Event],
        answered: Callable[[], int],
    ) -> None:
        """Until every call is answered, or `grace` has passed since the last answer once one
        backend has answered with a result (before that, the wait is the backends' own: with
        nothing to show, a list waits for the first backend able to answer it), and no backend
        still out is starting (within fan_out.start_wait of its start)."""
        catalogs = self.catalogs
        while len(replies) < len(calls):
            changed = progress[0]
            if not answered():
                await changed.wait()
                continue
            left = max((catalogs.start_left(b) for b, _ in calls if b not in replies), default=0)
            if left > 0:
                # A backend still starting (its first catalog load under way) is waited for,
                # up to fan_out.start_wait from its start: a list made at start-up shows every
                # backend that starts that quickly (a later one is announced by list changes).
                with anyio.move_on_after(left):
                    await first_of(changed, catalogs.changed)
                continue
            with anyio.move_on_after(self._grace) as scope:
                await changed.wait()
            if scope.cancelled_caught:
                return

    async def _discover(self, msg: Message, view: View | None, call: Call) -> Message:
        calls = [(name, msg) for name in self._order]
        exposures, naming = self._exposures, self._naming  # (as they were, should a reload come)
        # Discovery always answers with what the reachable backends declare: under fail_closed
        # too, a client must be able to connect and see that something is missing.
        parts = await self._fan_out(calls, call, fail_open=True)
        if view is not None:
            parts = self._as_seen(view, parts)
        pairs = [(exposures[b].namespace, r) for b, r in parts]
        result = merge.discover_result(
            pairs,
            prefixed=naming.prefixed,
            server=self._info.as_implementation(),
            alone=len(calls) == 1,
        )
        return jsonrpc.result(msg["id"], result)

    def _as_seen(
        self, view: View, parts: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, dict[str, Any]]]:
        """Discovery results as this caller sees them: a backend it can see nothing of is left
        out (its capabilities and instructions too), and a capability whose every item is
        hidden is not advertised. Judged on the loaded catalogs: a backend whose catalog is not
        known yet is shown as it declares itself (its lists are filtered all the same)."""
        out = []
        for backend, result in parts:
            hidden = self._hidden_capabilities(view, backend)
            if hidden == ALL_HIDDEN:
                continue  # nothing of it is visible
            caps = result.get("capabilities")
            if hidden and isinstance(caps, dict):
                shown = {k: v for k, v in caps.items() if k not in hidden}
                result = {**result, "capabilities": shown}
            out.append((backend, result))
        return out

    def _hidden_capabilities(self, view: View, backend: str) -> frozenset[str]:
        """core/policy.py `hidden_capabilities`, by the backend's loaded catalog."""
        return hidden_capabilities(view, backend, self.catalogs.data(backend))

    async def _list(self, msg: Message, view: View | None, call: Call) -> Message:
        method = msg["method"]
        key = merge.LIST_KEYS[method]
        params = jsonrpc.params(msg)
        positions = self._positions(method, params.get("cursor"))
        exposures, naming = self._exposures, self._naming  # (as they were, should a reload come)
        alone = len(self._order) == 1
        calls = []
        for backend, position in positions:
            page_params = {k: v for k, v in params.items() if k != "cursor"}
            if position is not None:
                page_params["cursor"] = position
            calls.append((backend, {**msg, "params": page_params}))
        late: list[str] = []
        parts = await self._fan_out(calls, call, late=late)
        if late:
            parts = self._as_last_known(parts, positions, late, key)
        items: list[Any] = []
        # A backend too late for this page keeps its place if it answered an earlier page of
        # this listing: its next page comes on a later one (alone, it is waited for), so no
        # item is lost to lateness. One late on the first page is shown from its catalog.
        kept: dict[str, str | None] = {b: p for b, p in positions if b in late and p is not None}
        kind, field = LIST_KINDS[key]
        hide_app_only = key == "tools" and apps.hides_app_only(msg, alone and not naming.prefixed)
        for backend, result in parts:
            exposure = exposures[backend]
            for item in result.get(key) or ():
                if not isinstance(item, dict) or (hide_app_only and app_only(item)):
                    continue
                if view is not None:
                    own = item.get(field)
                    if not isinstance(own, str) or not view.visible(kind, backend, own):
                        continue  # hidden, not refused: not a denial
                shown = routes.expose(naming, exposure, key, item)
                if shown is not None:
                    items.append(shown)
            if isinstance(result.get("nextCursor"), str):
                kept[backend] = result["nextCursor"]
        following = [(b, kept[b]) for b, _ in positions if b in kept]  # (in the same order)
        next_cursor = cursors.encode(following, self._cursor_keys[0], method) if following else None
        base = parts[0][1] if alone and parts else {}
        result = merge.list_result(
            key, items, [r for _, r in parts], next_cursor, self._info.as_implementation(), base
        )
        return jsonrpc.result(msg["id"], result)

    def _as_last_known(
        self,
        parts: list[tuple[str, dict[str, Any]]],
        positions: list[cursors.Position],
        late: list[str],
        key: str,
    ) -> list[tuple[str, dict[str, Any]]]:
        """A backend too late for the first page of a listing, shown as its catalog last
        listed it (every page of it): a slow backend's items do not vanish from lists while it
        is slow, and the page is marked not to be cached (`ttlMs` 0). One whose catalog was
        never loaded is left out, as if it had failed."""
        answered = dict(parts)
        out: list[tuple[str, dict[str, Any]]] = []
        for backend, position in positions:
            if backend in answered:
                out.append((backend, answered[backend]))
                continue
            data = self.catalogs.data(backend) if position is None and backend in late else None
            if data is not None:
                out.append((backend, {key: list(getattr(data, CATALOG_FIELDS[key])), "ttlMs": 0}))
        return out

    def _positions(self, method: str, cursor: object) -> list[cursors.Position]:
        if cursor is None:
            capability = merge.LIST_CAPABILITY[method]
            return [(b, None) for b in self._order if self.catalogs.has_capability(b, capability)]
        positions = cursors.decode(cursor, self._cursor_keys, method)
        # A cursor we issued names each backend once; one that names a backend twice was made
        # with a leaked key, and would make one request many backend requests.
        if (
            positions is None
            or any(b not in self.backends for b, _ in positions)
            or len({b for b, _ in positions}) != len(positions)
        ):
            raise Refused(codes.INVALID_PARAMS, "Invalid or expired cursor", "invalid_cursor")
        return positions


async def _ignore(_: Message) -> None:
    return None


def _unknown(kind: str, name: object, reason: str | None = "unknown_name") -> Refused:
    """The refusal of a name the gateway does not know (tools: server/tools, Error Handling);
    a name the policy denies gets the very same."""
    return Refused(codes.INVALID_PARAMS, f"Unknown {kind}: {name}", reason)


def _readable(view: View) -> Callable[[str, str], bool]:
    """Whether this caller may read a backend's resource: what it may subscribe to."""

    def readable(backend: str, uri: str) -> bool:
        return view.decide(RESOURCE, backend, uri).allowed

    return readable


def _rejection_reason(reply: Message) -> str:
    return (
        "unsupported_version"
        if jsonrpc.error_code(reply) == codes.UNSUPPORTED_PROTOCOL_VERSION
        else "invalid_meta"
    )


def _as_failure(backend: str, reply: Message | Exception) -> Exception:
    if isinstance(reply, Exception):
        return reply
    error = reply.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return Refused(code if isinstance(code, int) else codes.INTERNAL_ERROR, _describe(reply))


def _describe(reply: Message | Exception) -> str:
    if isinstance(reply, Exception):
        return str(reply)
    error = reply.get("error")
    message = error.get("message") if isinstance(error, dict) else "no result"
    return f"answered {message!r}"

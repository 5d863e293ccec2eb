"""The engine: checks a request's protocol fields, answers what the gateway owns (discovery,
merged lists: core/fanout.py), routes the rest to the backend that owns the name, and turns
every failure into a JSON-RPC error (via `errors`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway import errors
from gateway.backends.base import GATEWAY_CALL, Backend, Call, NotificationSink
from gateway.caller_auth.identity import Identity
from gateway.config.model import DEFAULT_FAN_OUT_GRACE, DEFAULT_FAN_OUT_START_WAIT
from gateway.config.search import ToolSearchConfig
from gateway.core import apps, tasks, unknown
from gateway.core.catalog import Catalogs
from gateway.core.fanout import FanOut
from gateway.core.listen import Subscriptions
from gateway.core.overload import Bound
from gateway.core.policy import (
    DENY,
    PROMPT,
    RESOURCE,
    TEMPLATE,
    TOOL,
    Policy,
    View,
)
from gateway.core.ratelimit import RateLimiter, SharedRateLimiter
from gateway.errors import InsufficientScope, Refused
from gateway.origin import STDIO_ORIGIN, Origin
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.routing import merge, uris
from gateway.routing import table as routes
from gateway.routing.names import Naming
from gateway.routing.table import Exposure, Route, RouteTable
from gateway.telemetry.api import NoTelemetry, Telemetry, tapped

if TYPE_CHECKING:
    from gateway.core.toolsearch import ToolSearch

log = logging.getLogger("gateway")

# Client notifications the gateway consumes itself instead of forwarding.
LOCAL_NOTIFICATIONS = frozenset({"notifications/cancelled"})
# Not counted against the overall bound on requests in flight: a stream as long as its client.
LISTEN = "subscriptions/listen"
FAIL_OPEN = "fail_open"
Finder = Callable[[RouteTable, str], Route | None]


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
        tool_search: ToolSearchConfig | None = None,
        shared_catalogs: Catalogs | None = None,
    ) -> None:
        """`shared_catalogs`: the merged server's, for a virtual server's dispatcher
        (core/virtual.py): its catalogs are loaded once, for every server."""
        self.telemetry: Telemetry = telemetry or NoTelemetry()
        self._policy = self._consulted(policy)  # None: every caller may see and call everything
        self.limiter = limiter
        # Instead of `limiter` when replicas share their buckets (cluster.redis).
        self.shared_limiter = shared_limiter
        # Client requests in flight, all front ends together (None: unbounded, for tests).
        self.bound = bound
        self.backends = {b.name: b for b in backends}
        self._order = [b.name for b in backends]
        self._exposures = {e.backend: e for e in exposures}
        self._naming = naming
        self.catalogs = Catalogs(
            backends, exposures, naming, info.as_implementation(), start_wait, shared_catalogs
        )
        # Cursors are signed so a forged one is refused. `cursor_keys` (from cluster.secrets:
        # the signing key first, then older ones still accepted) let a page from one replica
        # continue on another; without them the key is this process's own, and a cursor from
        # another process or from before a restart is stale (the spec lets cursors expire).
        keys = self.cursor_keys = tuple(cursor_keys) or (os.urandom(32),)
        # Discovery and the lists (core/fanout.py).
        self.fan_out = FanOut(self.catalogs, info.as_implementation, keys, grace)
        fail_open = on_failure == FAIL_OPEN
        self.fan_out.route_over(self.backends, self._order, self._exposures, naming, fail_open)
        self.fan_out_failures = self.fan_out.failures
        self.subscriptions = Subscriptions(
            self.backends, self.catalogs, self._exposures, naming, grace
        )
        self._notes = unknown.NotificationGate(self.telemetry.stats.rejections)
        # Task ids are sealed (core/tasks.py): keys from cluster.secrets or a key file (app/).
        self.tasks = tasks.TaskRouter(self, task_keys or (os.urandom(32),))
        self.tasks.attach(limiter, shared_limiter)
        # None: every tool is listed (tool_search off); else core/toolsearch.py.
        self.search: ToolSearch | None = None
        self._search_with(tool_search)

    def _search_with(self, config: ToolSearchConfig | None) -> None:
        if config is None or not config.enabled:
            if self.search is not None:
                self.search.close()
            self.search = None
        elif self.search is None:
            # Imported here: a config without `tool_search:` never loads the index.
            from gateway.core.toolsearch import ToolSearch

            self.search = ToolSearch(config, self.catalogs)
        else:
            self.search.config = config  # (its index is of the same catalogs: kept)

    def reconfigure(
        self,
        backends: Sequence[Backend],
        exposures: Sequence[Exposure],
        naming: Naming,
        on_failure: str,
        policy: Policy | None,
        limiter: RateLimiter | None,
        shared_limiter: SharedRateLimiter | None = None,
        tool_search: ToolSearchConfig | None = None,
    ) -> list[str]:
        """A reloaded config (gateway/app/ `Gateway.reload`): from now on requests route over these
        backends, names and rules. Synchronous, so no request sees half of it; the maps are
        replaced, not changed, so a fan-out under way keeps the set it began with. Returns the
        backends whose catalogs are to be loaded."""
        self.backends = {b.name: b for b in backends}
        self._order = [b.name for b in backends]
        self._exposures = {e.backend: e for e in exposures}
        self._naming = naming
        self._policy = self._consulted(policy)
        self.limiter = limiter
        self.shared_limiter = shared_limiter
        self.tasks.attach(limiter, shared_limiter)
        self._search_with(tool_search)
        fail_open = on_failure == FAIL_OPEN
        self.fan_out.route_over(self.backends, self._order, self._exposures, naming, fail_open)
        loads = self.catalogs.reconfigure(backends, exposures, naming)
        # After the table: open listens are extended to the added backends by its routes.
        self.subscriptions.reconfigure(self.backends, self._exposures, naming)
        return loads

    def _consulted(self, policy: Policy | None) -> Policy | None:
        """A policy whose rules read tools' annotations reads them from these catalogs."""
        if policy is not None and policy.inspects:
            policy.consult(self._definition)
        return policy

    def _definition(self, backend: str, name: str) -> Mapping[str, Any] | None:
        data = self.catalogs.data(backend)
        return None if data is None else data.tools_by_name.get(name)

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
                        if self.search is not None:
                            # `_call_tool`: the call it names, judged as that call from here.
                            msg = self.search.unwrap(msg)
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
        stale, and it is loaded again in the background (and, with a cluster bus, the other
        replicas hear of it: `Subscriptions.heard`)."""
        if str(msg.get("method", "")).endswith("/list_changed"):
            self.catalogs.list_changed(backend)
        self.subscriptions.heard(backend, msg)

    async def param_headers(
        self, tool: str, identity: Identity | None = None
    ) -> tuple[ParamHeader, ...] | None:
        """The `x-mcp-header` annotations of a client-visible tool, if the tool is known (after
        refreshing stale catalogs: callers look in `catalogs.table` first, without a coroutine)
        and the policy shows it to the caller."""
        if self.search is not None and tool in self.search.NAMES:
            return None  # (a meta-tool: no annotations, and no catalog to refresh)
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
        # (`jsonrpc.params` inlined here and on the rest of the request path: the call costs
        # more than its work, several times a request)
        params = found if isinstance(found := msg.get("params"), dict) else {}
        # What this caller may see and call (None: no policy, everything).
        view = self._policy.view(origin.identity) if self._policy is not None else None
        if method == "tools/call":
            name = params.get("name")
            if self.search is not None and isinstance(name, str) and name in self.search.LOCAL:
                return await self.search.answer(msg, view, call)
            # A known tool is found without a coroutine; only a miss may refresh catalogs.
            found = self.catalogs.table.tool(name) if isinstance(name, str) else None
            route = found or await self._route_name(RouteTable.tool, TOOL, name, view, call)
            self._permit(view, TOOL, route, name, params)
            reply = await self._forward(msg, params, sink, route, "name", call)
            return self.tasks.created(reply, route, name, origin.identity)
        if method in tasks.METHODS:
            return await self.tasks.forward(msg, sink, call, view)
        if method == "server/discover":
            return await self.fan_out.discover(msg, view, call)
        if method in merge.LIST_KEYS:
            search = self.search
            if method == "tools/list" and search is not None and await search.replaces_list():
                return search.list_result(msg, self.catalogs.client_info)
            return await self.fan_out.list_page(msg, view, call)
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
        return _readable(view), functools.partial(self.fan_out.hidden_capabilities, view)

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
        pinning = self.catalogs.pinning
        if pinning is not None and pinning.withholds(exposure.backend, name):
            return False  # (a definition pins hold back, as a lenient server may read it)
        return unknown.may_guess_name(kind, name, exposure, self._guarded, view, data, limited)

    def _permit(
        self,
        view: View | None,
        kind: str,
        route: Route,
        shown: object,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Refuse what the policy does not let this caller call: a denied name exactly as an
        unknown one (nothing tells the two apart), one that needs scopes the caller lacks with
        those scopes, for a step-up. `params`: a tool call's, for rules on its arguments."""
        if view is None:
            return
        if kind in (RESOURCE, TEMPLATE):
            # A URI is also judged as a server may resolve it (an encoded slash taken for one).
            readings = uris.readings(route.name)
            verdict = unknown.judged(view, kind, route.backend, route.name, readings)
        elif params is not None and view.inspects:
            verdict = view.decide_call(route.backend, route.name, params.get("arguments"))
            if verdict == DENY and view.visible(TOOL, route.backend, route.name):
                # Listed, so not unknown: refused for its arguments, with the same code.
                self.telemetry.stats.policy_denials["denied"] += 1
                raise Refused(codes.INVALID_PARAMS, f"Tool {shown}: arguments not allowed")
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

    def _forward(
        self,
        msg: Message,
        params: dict[str, Any],
        sink: NotificationSink,
        route: Route,
        field: str,
        call: Call,
    ) -> Coroutine[Any, Any, Message]:
        """Send a request to its backend under the backend's own name, and show the reply's
        URIs as clients know them. (A plain function: without prefixes, the backend's request
        is handed back as it is, no frame of its own.)"""
        visible = params.get(field)
        # Only listed tool and prompt names become metric labels: their number is bounded.
        target = visible if field == "name" and route.listed else None
        call.observation.annotate(target=target, backend=route.backend)
        out = msg if visible == route.name else {**msg, "params": {**params, field: route.name}}
        # Taken before the request: a reload meanwhile (which lets this request finish) must
        # not change how its reply is shown.
        naming = self._naming
        backend = self.backends[route.backend]
        if not naming.prefixed:
            return backend.request(out, sink, call)
        exposure = self._exposures[route.backend]
        return self._exposed(backend.request(out, sink, call), naming, exposure, msg["method"])

    @staticmethod
    async def _exposed(
        sent: Coroutine[Any, Any, Message], naming: Naming, exposure: Exposure, method: str
    ) -> Message:
        reply = await sent
        routes.expose_reply_uris(naming, exposure, method, reply)
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

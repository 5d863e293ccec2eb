"""What the gateway answers from every backend at once: `server/discover` and the merged lists
(tools, prompts, resources, templates). One request is fanned out to every backend that can
answer it, late and failing backends are skipped under fail_open (0010), and the answers are
merged into one, as this caller may see them, with a signed cursor holding each backend's own
(0009).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from gateway import errors
from gateway.backends.base import Backend, Call
from gateway.core import apps
from gateway.core.catalog import Catalogs
from gateway.core.listen import first_of
from gateway.core.policy import (
    ALL_HIDDEN,
    PROMPT,
    RESOURCE,
    TEMPLATE,
    TOOL,
    View,
    hidden_capabilities,
)
from gateway.errors import Refused
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.routing import cursor as cursors
from gateway.routing import merge
from gateway.routing import table as routes
from gateway.routing.apps import app_only
from gateway.routing.names import Naming
from gateway.routing.table import Exposure

log = logging.getLogger("gateway")

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


class FanOut:
    """The dispatcher's fan-outs. It routes over the backends and names the dispatcher hands it
    (`route_over`, at start and at each reload: maps replaced, not changed, so a fan-out under
    way keeps the set it began with); `failures` counts each backend's failed answers."""

    # What it routes over, as `route_over` last handed it.
    backends: dict[str, Backend]
    _order: list[str]
    _exposures: dict[str, Exposure]
    _naming: Naming
    _fail_open: bool

    def __init__(
        self,
        catalogs: Catalogs,
        server: Callable[[], dict[str, Any]],
        cursor_keys: tuple[bytes, ...],
        grace: float,
    ) -> None:
        self.catalogs = catalogs
        self._server = server  # the gateway's own Implementation, for merged results
        self._cursor_keys = cursor_keys
        self._grace = grace
        self.failures: dict[str, int] = {}
        # Backends skipped by the last fan-out that asked them: logged when they start being
        # skipped, not on every list while they stay so.
        self._skipping: set[str] = set()
        # A virtual server's (core/virtual.py): its own serverInfo even over one backend, its
        # instructions (None: the backends'), and per backend the capabilities it selects
        # nothing of, which its discovery does not advertise.
        self.own_server = False
        self.instructions: str | None = None
        self.unselected: Mapping[str, frozenset[str]] = {}

    def route_over(
        self,
        backends: dict[str, Backend],
        order: list[str],
        exposures: dict[str, Exposure],
        naming: Naming,
        fail_open: bool,
    ) -> None:
        self.backends = backends
        self._order = order
        self._exposures = exposures
        self._naming = naming
        self._fail_open = fail_open

    async def _ask_all(
        self,
        calls: Sequence[tuple[str, Message]],
        call: Call,
        *,
        fail_open: bool | None = None,
        late: list[str] | None = None,
        shown: int = 0,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Send requests to several backends at once; each answer's result in the same order.

        A failing backend is skipped under fail_open (logged when it starts failing, counted
        every time) and fails the whole request under fail_closed; when every backend fails,
        so does the request. Under fail_open a backend that has not answered `grace` seconds
        after the last answer (fan_out.grace: a silent one, a black hole, a slow one) is
        skipped too, its request cancelled (and named in `late`): one backend never holds the
        others' lists for long. Under fail_closed every answer is awaited (each bounded by its
        backend's request timeout). `shown`: parts of the same result already in hand (from
        the catalogs), answers as good as these backends' for the grace and for failing."""
        open_policy = self._fail_open if fail_open is None else fail_open
        replies: dict[str, Message | Exception] = {}
        targets = self.backends  # the set `calls` was made from, should a reload come first
        progress = [anyio.Event()]  # set (and replaced) at each answer
        answered = shown  # how many answered with a result

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
            if open_policy and len(calls) + shown > 1:
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
            self.failures[backend] = self.failures.get(backend, 0) + 1
            if not open_policy:
                raise _as_failure(backend, reply)
            failed.append(_as_failure(backend, reply))
            # A backend known to be down was logged when it went down, and an overloaded one
            # is logged by its bound (at most every 10 s); any other once when it starts being
            # skipped, not on every list while it stays so. A lone backend is never skipped:
            # its failure is the list's error (below), for the client to see.
            quiet = isinstance(reply, errors.BackendDown | errors.BackendOverloaded)
            quiet = quiet or len(calls) + shown == 1
            level = logging.DEBUG if quiet or backend in self._skipping else logging.WARNING
            self._skipping.add(backend)
            log.log(level, "fan-out: backend %s skipped: %s", backend, _describe(reply))
        if failed and not out and not shown:
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

    async def discover(self, msg: Message, view: View | None, call: Call) -> Message:
        calls = [(name, msg) for name in self._order]
        exposures, naming = self._exposures, self._naming  # (as they were, should a reload come)
        # Discovery always answers with what the reachable backends declare: under fail_closed
        # too, a client must be able to connect and see that something is missing.
        parts = await self._ask_all(calls, call, fail_open=True)
        if view is not None:
            parts = self._as_seen(view, parts)
        if self.unselected:
            parts = [(b, _without(r, self.unselected.get(b, frozenset()))) for b, r in parts]
        pairs = [(exposures[b].namespace, r) for b, r in parts]
        result = merge.discover_result(
            pairs,
            prefixed=naming.prefixed,
            server=self._server(),
            alone=len(calls) == 1 and not self.own_server,
        )
        if self.instructions is not None:
            result["instructions"] = self.instructions
        elif self.own_server and len(pairs) == 1 and not naming.prefixed:
            # A virtual server of one backend under its own names: its instructions as written
            # (they name its tools as the server shows them).
            found = pairs[0][1].get("instructions")
            if isinstance(found, str):
                result["instructions"] = found
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
            hidden = self.hidden_capabilities(view, backend)
            if hidden == ALL_HIDDEN:
                continue  # nothing of it is visible
            caps = result.get("capabilities")
            if hidden and isinstance(caps, dict):
                shown = {k: v for k, v in caps.items() if k not in hidden}
                result = {**result, "capabilities": shown}
            out.append((backend, result))
        return out

    def hidden_capabilities(self, view: View, backend: str) -> frozenset[str]:
        """core/policy.py `hidden_capabilities`, by the backend's loaded catalog."""
        return hidden_capabilities(view, backend, self.catalogs.data(backend))

    async def list_page(self, msg: Message, view: View | None, call: Call) -> Message:
        method = msg["method"]
        key = merge.LIST_KEYS[method]
        params = jsonrpc.params(msg)
        positions = self._positions(method, params.get("cursor"))
        exposures, naming = self._exposures, self._naming  # (as they were, should a reload come)
        alone = len(self._order) == 1
        known = self._from_catalog(positions, params, key, exposures)
        calls = []
        for backend, position in positions:
            if backend in known:
                continue
            page_params = {k: v for k, v in params.items() if k != "cursor"}
            if position is not None:
                page_params["cursor"] = position
            calls.append((backend, {**msg, "params": page_params}))
        late: list[str] = []
        parts = await self._ask_all(calls, call, late=late, shown=len(known)) if calls else []
        if known:
            answered = {**dict(parts), **known}
            parts = [(b, answered[b]) for b, _ in positions if b in answered]
        if late:
            parts = self._as_last_known(parts, positions, late, key)
        items: list[Any] = []
        # A backend too late for this page keeps its place if it answered an earlier page of
        # this listing: its next page comes on a later one (alone, it is waited for), so no
        # item is lost to lateness. One late on the first page is shown from its catalog.
        kept: dict[str, str | None] = {b: p for b, p in positions if b in late and p is not None}
        kind, field = LIST_KINDS[key]
        hide_app_only = key == "tools" and apps.hides_app_only(msg, alone and not naming.prefixed)
        # A rule on annotations judges a listed tool by the definition the list shows.
        by_definition = view is not None and view.inspects and kind == TOOL
        pinning = self.catalogs.pinning
        for backend, result in parts:
            exposure = exposures[backend]
            # pins: a live answer's definitions are judged (a catalog's were when it loaded)
            pinned = pinning is not None and pinning.covers(backend) and backend not in known
            unjudged = False
            for item in result.get(key) or ():
                if not isinstance(item, dict) or (hide_app_only and app_only(item)):
                    continue
                if pinned and pinning is not None:
                    admitted, new = pinning.admits(backend, key, item)
                    unjudged = unjudged or new
                    if not admitted:
                        continue
                if view is not None:
                    own = item.get(field)
                    if not isinstance(own, str):
                        continue
                    if by_definition:
                        if not view.decide_tool(backend, own, item).visible:
                            continue
                    elif not view.visible(kind, backend, own):
                        continue  # hidden, not refused: not a denial
                shown = routes.expose(naming, exposure, key, item)
                if shown is not None:
                    items.append(shown)
            if isinstance(result.get("nextCursor"), str):
                kept[backend] = result["nextCursor"]
            if unjudged:  # (its catalog loaded again: that load logs and counts the change)
                self.catalogs.list_changed(backend)
        following = [(b, kept[b]) for b, _ in positions if b in kept]  # (in the same order)
        next_cursor = cursors.encode(following, self._cursor_keys[0], method) if following else None
        base = parts[0][1] if alone and parts else {}
        result = merge.list_result(
            key, items, [r for _, r in parts], next_cursor, self._server(), base
        )
        return jsonrpc.result(msg["id"], result)

    def _from_catalog(
        self,
        positions: list[cursors.Position],
        params: Mapping[str, Any],
        key: str,
        exposures: Mapping[str, Exposure],
    ) -> dict[str, dict[str, Any]]:
        """The parts of a listing's first page taken from the backends' catalogs rather than
        asked (server/utilities/caching): a backend up, whose list any caller may be shown now
        by its own hints (core/catalog.py `Shared`), unless its config says to ask it every
        time. A page past the first is asked (its cursor is the backend's own), and so is a
        request with anything but `_meta` (a retry carrying `requestState` or `inputResponses`
        is not cacheable). A part says how much longer it is fresh, so a client caching the
        merged page caches it no longer than the backend said."""
        if any(name != "_meta" for name in params):
            return {}
        catalogs, targets = self.catalogs, self.backends
        now = anyio.current_time()
        known: dict[str, dict[str, Any]] = {}
        for backend, _ in positions:
            if not exposures[backend].lists_from_catalog:
                continue
            found = catalogs.shared_list(backend, key, now)
            left = int((found.until - now) * 1000) if found is not None else 0
            if found is None or left <= 0 or not targets[backend].up:
                continue
            known[backend] = {**found.base, key: found.items, "ttlMs": left, "cacheScope": "public"}
            catalogs.from_catalog[backend] = catalogs.from_catalog.get(backend, 0) + 1
        return known

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


def _without(result: dict[str, Any], hidden: frozenset[str]) -> dict[str, Any]:
    """A discovery result without the capabilities a virtual server selects nothing of."""
    caps = result.get("capabilities")
    if not hidden or not isinstance(caps, dict):
        return result
    return {**result, "capabilities": {k: v for k, v in caps.items() if k not in hidden}}


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

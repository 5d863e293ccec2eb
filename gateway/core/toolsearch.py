"""Tool search (docs/guides/tool-search.md): while it is on, a server's tools/list shows three
meta-tools instead of its catalog: one finds tools by words, one shows a tool's whole
definition, one calls a tool by its name. The real tools stay callable by name.

A call through `_call_tool` is rewritten into the call of the tool it names before anything
judges it (core/dispatcher.py `serve`), so rate limits, the policy, routing, progress,
input_required retries and tasks see exactly the call the client could have made itself. The
other two are answered here, from an index of the server's catalog (routing/search.py),
filtered by the caller's policy view: a caller never finds or reads what it may not see.

The index follows the route table: once one has been built, each rebuild of the table (a
catalog load, a reload) has it rebuilt in passes in a worker thread (core/passes.py), and a
search meanwhile answers from the index it has. A backend's list change has its catalog loaded
again at once by the catalogs (`Catalogs.list_changed`), so a search finds what the backend
offers now without waiting for a list or a miss to refresh it.

The meta-tools' names begin with `_`: a prefixed name begins with its namespace, which begins
with a letter or digit (config: namespaces and backend names), so under prefixing no backend
tool can take one of them. Unprefixed (one backend under `auto`, or `never`), a backend tool
named like one is shadowed by it (left out of the index, logged once per build).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Generator
from typing import Any

import anyio

from gateway.backends.base import Call
from gateway.config.search import ToolSearchConfig
from gateway.core import passes
from gateway.core.catalog import Catalogs
from gateway.core.policy import TOOL, View
from gateway.errors import Refused
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.routing import budget, merge, search
from gateway.routing.search import Entry, Index
from gateway.routing.table import CatalogData, RouteTable

log = logging.getLogger("gateway.search")

FIND = "_search_tools"
DESCRIBE = "_describe_tool"
CALL = "_call_tool"
# Answered here; `_call_tool` is rewritten into the call it names instead.
LOCAL = frozenset({FIND, DESCRIBE})
NAMES = frozenset({FIND, DESCRIBE, CALL})
# Results a search answers with when the caller does not say (capped by max_results).
DEFAULT_LIMIT = 5

_NAME_ARGUMENT = {
    "type": "string",
    "description": "The tool's name exactly as _search_tools returned it.",
}
META_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": FIND,
        "title": "Search tools",
        "description": (
            "Find the tools for a task among the many this server offers: describe what you "
            "want to do in a few words. Returns the best matches with their names, a one-line "
            "description and their arguments. Call one with _call_tool; _describe_tool shows "
            "a tool's full definition."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "What the tool should do, or words of its name.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "How many tools to return at most (default 5).",
                },
            },
            "required": ["query"],
        },
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    },
    {
        "name": DESCRIBE,
        "title": "Describe a tool",
        "description": (
            "The full definition of one tool (description, input and output schemas), by "
            "the name _search_tools returned."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"name": _NAME_ARGUMENT},
            "required": ["name"],
        },
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    },
    {
        "name": CALL,
        "title": "Call a tool",
        "description": (
            "Call a tool by the name _search_tools returned, with its arguments; the result "
            "is that tool's own."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "name": _NAME_ARGUMENT,
                "arguments": {
                    "type": "object",
                    "description": "The tool's arguments, as its input schema describes them.",
                },
            },
            "required": ["name"],
        },
    },
)
# What listing the meta-tools costs a model, against what the catalog would (the figures in
# docs/guides/tool-search.md).
META_TOKENS = budget.estimate_tokens(META_TOOLS)


class ToolSearch:
    """One server's tool search, over its dispatcher's catalogs."""

    # The meta-tools' names (the dispatcher asks here: it imports this module only when a
    # server searches).
    NAMES = NAMES
    LOCAL = LOCAL

    def __init__(self, config: ToolSearchConfig, catalogs: Catalogs) -> None:
        self.config = config  # replaced by a reload (the dispatcher's `reconfigure`)
        self._catalogs = catalogs
        self._index: Index | None = None
        self._indexed: RouteTable | None = None  # the table `_index` was built from
        self._covered: frozenset[str] = frozenset()  # the backends with a catalog in `_index`
        self._building: RouteTable | None = None  # the table of the build under way, if any
        self._built = anyio.Event()  # set (and replaced) when a build ends
        self._generation = 0  # of the newest build started: an older one ending is dropped
        self.builds = 0  # indexes built, for tests and the bench
        catalogs.on_rebuilt.append(self._table_rebuilt)

    def close(self) -> None:
        """Search turned off (a reload): the catalogs' rebuilds no longer reach this index."""
        if self._table_rebuilt in self._catalogs.on_rebuilt:
            self._catalogs.on_rebuilt.remove(self._table_rebuilt)

    def _table_rebuilt(self) -> None:
        # Before the first index nobody has searched: the first search builds it.
        if self._index is not None and self._catalogs.spawn is not None:
            self._catalogs.spawn(self.rebuild)

    # --- the hot path's part: a dict lookup --------------------------------------------------

    def unwrap(self, msg: Message) -> Message:
        """A call of `_call_tool` as the call of the tool it names (its `_meta`, task and retry
        fields kept); any other request as it is."""
        params = msg.get("params")
        if type(params) is not dict or params.get("name") != CALL:
            return msg
        arguments = params.get("arguments")
        if not isinstance(arguments, dict):
            raise Refused(codes.INVALID_PARAMS, f"{CALL} needs arguments: name and arguments")
        name = arguments.get("name")
        inner = arguments.get("arguments", {})
        if not isinstance(name, str) or name in NAMES:
            raise Refused(codes.INVALID_PARAMS, f"{CALL}: arguments.name must name a tool")
        if not isinstance(inner, dict):
            raise Refused(codes.INVALID_PARAMS, f"{CALL}: arguments.arguments must be an object")
        return {**msg, "params": {**params, "name": name, "arguments": inner}}

    # --- tools/list --------------------------------------------------------------------------

    async def replaces_list(self) -> bool:
        """Whether tools/list shows the meta-tools now: `on`, or `auto` while the catalog is
        estimated above the threshold (by the newest index; the first list builds one)."""
        mode = self.config.mode
        if mode == "on":
            return True
        if mode != "auto":
            return False
        index = await self.index()
        return index.tokens > self.config.threshold_tokens

    def list_result(self, msg: Message, server: dict[str, Any]) -> Message:
        """The meta-tools, as one page. A cursor cannot be one of this list's (it has one
        page): one from the whole list, issued before search came on, has expired."""
        if jsonrpc.params(msg).get("cursor") is not None:
            raise Refused(codes.INVALID_PARAMS, "Invalid or expired cursor", "invalid_cursor")
        # The same for every caller (public), and not to be kept: `auto` or a reload may turn
        # the whole list back on (server/utilities/caching).
        hints = {"ttlMs": 0, "cacheScope": "public"}
        result = merge.list_result("tools", list(META_TOOLS), [hints], None, server)
        return jsonrpc.result(msg["id"], result)

    # --- the meta-tools answered here --------------------------------------------------------

    async def answer(self, msg: Message, view: View | None, call: Call) -> Message:
        """The result of `_search_tools` or `_describe_tool` for this caller."""
        params = jsonrpc.params(msg)
        name = params.get("name")
        arguments = params.get("arguments", {})
        if not isinstance(arguments, dict):
            raise Refused(codes.INVALID_PARAMS, f"{name}: arguments must be an object")
        call.observation.annotate(target=name)
        await self._until_started()
        index = await self.index()
        shown = None if view is None else _shown_by(view)
        if name == FIND:
            query, limit = self._query(arguments)
            found = [search.summary(e) for e, _ in index.search(query, limit, shown)]
            return _tool_result(msg, {"tools": found})
        wanted = arguments.get("name")
        if not isinstance(wanted, str):
            raise Refused(codes.INVALID_PARAMS, f"{DESCRIBE}: arguments.name must be a string")
        entry = index.find(wanted)
        if entry is None or (shown is not None and not shown(entry)):
            # A hidden tool is unknown, exactly as a call of it would be (core/dispatcher.py).
            raise Refused(codes.INVALID_PARAMS, f"Unknown tool: {wanted}", "unknown_name")
        return _tool_result(msg, entry.tool)

    def _query(self, arguments: dict[str, Any]) -> tuple[str, int]:
        query = arguments.get("query")
        if not isinstance(query, str):
            raise Refused(codes.INVALID_PARAMS, f"{FIND}: arguments.query must be a string")
        if len(query) > self.config.max_query_length:
            most = self.config.max_query_length
            raise Refused(codes.INVALID_PARAMS, f"{FIND}: the query is over {most} characters")
        limit = arguments.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise Refused(codes.INVALID_PARAMS, f"{FIND}: arguments.limit must be 1 or more")
        return query, min(limit, self.config.max_results)

    async def _until_started(self) -> None:
        """While a backend's first catalog load is under way (fan_out.start_wait at most, as a
        merged list waits), a search waits for it: one made at start-up finds its tools."""
        catalogs = self._catalogs
        while True:
            left = max((catalogs.start_left(b) for b in catalogs.table.exposures), default=0.0)
            if left <= 0:
                return
            with anyio.move_on_after(left):
                await catalogs.changed.wait()

    # --- the index ---------------------------------------------------------------------------

    @property
    def built(self) -> anyio.Event:
        """Set when the build under way ends (a new event after each)."""
        return self._built

    async def index(self) -> Index:
        """The index of the catalogs' table as it is now, or, while that one is being built
        from a newer table, the one before it: a reindex never holds a request. A search waits
        (for a build in a worker thread, so no other request does) only for the first index,
        and for one that would add a backend the index it has lacks (one that started late)."""
        table = self._catalogs.table
        if table is self._indexed and self._index is not None:
            return self._index
        if self._index is not None and self._loaded(table) <= self._covered:
            if self._building is not table and self._catalogs.spawn is not None:
                self._catalogs.spawn(self.rebuild)
                return self._index
            if self._building is table:
                return self._index
        if self._building is not table:
            await self.rebuild()
        while self._indexed is not table and self._building is table:
            await self._built.wait()
        if self._index is None:
            raise Refused(codes.INTERNAL_ERROR, "Tool search has no index (see the log)")
        return self._index

    def _loaded(self, table: RouteTable) -> frozenset[str]:
        """The backends of a table whose catalogs have been loaded."""
        return frozenset(b for b in table.exposures if self._catalogs.data(b) is not None)

    async def rebuild(self) -> None:
        """Index the catalogs' table as it is now, in passes in a worker thread (core/passes.py):
        a big catalog's build holds no request up for longer than a pass."""
        table = self._catalogs.table
        if table is self._indexed or table is self._building:
            return
        self._generation += 1
        generation = self._generation
        self._building = table
        catalogs = {b: self._catalogs.data(b) for b in table.exposures}
        try:

            def outdated() -> bool:  # (a first index is kept whatever comes after it)
                return generation != self._generation and self._index is not None

            steps = _passes(table, catalogs, outdated)
            try:
                built = await passes.run(steps)
            except Exception as exc:  # (a backend's list the index cannot read: keep the last)
                log.warning("tool search: index not rebuilt: %r", exc)
                return
            if built is None:
                return  # dropped for a newer table's build
            index, shadowed = built
            if generation == self._generation or self._index is None:
                self._index, self._indexed = index, table
                self._covered = frozenset(b for b, data in catalogs.items() if data is not None)
                self.builds += 1
                for name in shadowed:
                    log.warning("tool %s is shadowed by tool search's meta-tool", name)
        finally:
            if self._building is table:
                self._building = None
            self._built.set()
            self._built = anyio.Event()


def _passes(
    table: RouteTable, catalogs: dict[str, CatalogData | None], outdated: Callable[[], bool]
) -> Generator[None, None, tuple[Index, list[str]] | None]:
    """The index of a table, in passes (core/passes.py); None once `outdated` says a newer
    table's build has begun, which this one's result would lose to."""
    found: list[Entry] = []
    shadowed: list[str] = []
    steps = search.entry_passes(table, catalogs, NAMES, found, shadowed, passes.PER_PASS)
    for _ in itertools.chain(steps, [None]):  # (and a boundary before the index's passes)
        yield
        if outdated():
            return None
    building = Index.passes(found, passes.PER_PASS)
    while True:
        try:
            next(building)
        except StopIteration as end:
            return end.value, shadowed
        yield
        if outdated():
            return None


def _shown_by(view: View) -> Callable[[Entry], bool]:
    def shown(entry: Entry) -> bool:
        return view.visible(TOOL, entry.backend, entry.own)

    return shown


def _tool_result(msg: Message, structured: dict[str, Any]) -> Message:
    """A tool's result holding `structured`, and the same as JSON text for clients that read
    only content (server/tools, Structured Content)."""
    text = jsonrpc.dumps(structured).decode()
    result = {
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": False,
    }
    return jsonrpc.result(msg["id"], result)

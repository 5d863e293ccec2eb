"""The config's frozen object for tool search (`tool_search:`, docs/guides/tool-search.md): a
leaf of the package, like model.py. Declared once here so a virtual server's
`servers.NAME.tool_search` is the same section as the merged server's top-level `tool_search`."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.key import key

SEARCH_MODES = ("off", "on", "auto")
# `auto` turns search on past this many estimated tokens of tool definitions: about where a
# catalog starts to cost a model a noticeable share of its context (the context budget's
# estimate: routing/budget.py).
DEFAULT_THRESHOLD_TOKENS = 10_000
# Tools one search answers with at most; a caller may ask for fewer. Enough for a model to pick
# from, few enough that an answer stays a small fraction of the catalog it replaces.
DEFAULT_MAX_RESULTS = 10
# Characters of one search query: a query is a sentence or a few words; a longer one is refused
# before any work, so a huge body cannot buy seconds of tokenising on the event loop.
DEFAULT_MAX_QUERY_LENGTH = 1000


@dataclass(frozen=True)
class ToolSearchConfig:
    mode: str = key(
        "string",
        "off: list every tool; on: list the search meta-tools instead; auto: on when the "
        "catalog's estimated tokens exceed threshold_tokens.",
        "off",
        choices=SEARCH_MODES,
    )
    threshold_tokens: int = key(
        "count",
        "With mode auto: search is on while the tool list is estimated above this many tokens.",
        DEFAULT_THRESHOLD_TOKENS,
        minimum=1,
    )
    max_results: int = key(
        "count", "Most tools one search answers with.", DEFAULT_MAX_RESULTS, minimum=1
    )
    max_query_length: int = key(
        "count",
        "Longest search query in characters; a longer one is refused (-32602).",
        DEFAULT_MAX_QUERY_LENGTH,
        minimum=1,
    )

    @property
    def enabled(self) -> bool:
        """Whether the server may ever show the meta-tools (on, or auto)."""
        return self.mode != "off"

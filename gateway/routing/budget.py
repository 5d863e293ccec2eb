"""What a list costs a model, in tokens: an estimate, pure.

A host shows its model each tool as JSON text of its name, title, description and argument
schema (prompts and resources likewise); the output schema, annotations, icons and `_meta` are
the host's. No well-kept tokenizer package works offline (tiktoken downloads its vocabulary at
first use, and loading one costs ~45 MB), and models' tokenizers differ anyway, so this counts
the pieces a GPT-style BPE first splits text into (words, numbers, runs of punctuation) and adds
a little per byte for the longer pieces that split further. Calibrated against cl100k_base on
the reference servers' catalogs (tests/routing/budget_catalogs.json, bench/budget_calibrate.py):
within 10% on every catalog; docs/guides/context-budget.md has the figures.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.protocol import jsonrpc
from gateway.routing import table
from gateway.routing.names import Naming
from gateway.routing.table import CatalogData, Exposure

# The fields a model reads, of every kind of item (tools, prompts, resources, templates).
SHOWN = frozenset(
    {"name", "title", "description", "inputSchema", "arguments", "uri", "uriTemplate", "mimeType"}
)
# cl100k_base's pre-tokenizer, with the stdlib's classes: a letter is `[^\W\d_]`, and `_` is
# punctuation (as `\p{L}` and `\p{N}` would have it).
_PIECES = re.compile(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\w]?+[^\W\d_]++|\d{1,3}+| ?(?:[^\s\w]|_)++[\r\n]*+"
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
)
# Ideographs, kana, hangul and full-width forms: most are a token or so each, however they run.
_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
# Fitted (bench/budget_calibrate.py): a piece is a token, long pieces split a token per ~50
# bytes more; other text beyond ASCII (accents, Cyrillic, Greek) about a token per 5 bytes past
# its first, and CJK characters 0.85 of a token each.
BYTES_PER_EXTRA_TOKEN = 50
WIDE_BYTES_PER_TOKEN = 5
TOKENS_PER_CJK = 0.85
# Items per regex pass. One pass holds the GIL from start to end (a 1,000-tool catalog in one
# pass stalled the event loop for 140 ms even from a worker thread); between passes the thread
# gives the loop its turn. Each boundary adds a token or two to the estimate.
CHUNK = 16


def shown(item: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a list item a model is shown."""
    return {k: v for k, v in item.items() if k in SHOWN}


def estimate_tokens(items: Sequence[Mapping[str, Any]]) -> int:
    """The tokens a model pays to be shown `items` (one list's entries, as clients get them)."""
    if len(items) > CHUNK:
        return sum(estimate_tokens(items[i : i + CHUNK]) for i in range(0, len(items), CHUNK))
    if not items:
        return 0
    try:
        data = jsonrpc.dumps([shown(i) for i in items])  # (lone surrogates as their escapes)
    except TypeError:  # (orjson's refusal: nesting past its depth) an item it cannot write
        return 0 if len(items) == 1 else sum(estimate_tokens([i]) for i in items)
    text = data.decode()
    pieces = _PIECES.subn("", text)[1]  # (counts without building a list of the pieces)
    estimate = pieces + len(data) / BYTES_PER_EXTRA_TOKEN
    if not text.isascii():
        cjk = _CJK.subn("", text)[1]  # (each 3 bytes in UTF-8: 2 past its first)
        wide = len(data) - len(text) - 2 * cjk
        estimate += wide / WIDE_BYTES_PER_TOKEN + cjk * TOKENS_PER_CJK
    return round(estimate)


# The kinds of list a server offers, as metric labels, and each one's key in a catalog's items.
KINDS = {"tools": "tools", "prompts": "prompts", "resources": "resources",
         "templates": "resourceTemplates"}  # fmt: skip


@dataclass(frozen=True)
class Cost:
    """One list's entries, and the tokens a model pays to be shown them."""

    items: int = 0
    tokens: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.items + other.items, self.tokens + other.tokens)


def backend_costs(naming: Naming, exposure: Exposure, data: CatalogData) -> dict[str, Cost]:
    """What one backend adds to each of a server's lists: its items as that server's clients
    see them (filtered, renamed, namespaced), by kind."""
    steps = cost_passes(naming, exposure, data, 1 << 30)
    while True:
        try:
            next(steps)
        except StopIteration as end:
            costs: dict[str, Cost] = end.value
            return costs


def cost_passes(
    naming: Naming, exposure: Exposure, data: CatalogData, per_pass: int
) -> Generator[None, None, dict[str, Cost]]:
    """`backend_costs`, `per_pass` items at a time (one pass per `next`, core/passes.py); the
    same figures whatever `per_pass`."""
    per_pass = max(CHUNK, per_pass - per_pass % CHUNK)  # (the estimate's chunks, unchanged)
    out = {}
    for kind, listed in zip(
        KINDS, (data.tools, data.prompts, data.resources, data.templates), strict=True
    ):
        items = tokens = 0
        pending: list[Mapping[str, Any]] = []  # shown, not estimated yet: less than a chunk
        for start in range(0, len(listed), per_pass):
            for item in listed[start : start + per_pass]:
                shown_item = table.expose(naming, exposure, KINDS[kind], item)
                if shown_item is not None:
                    pending.append(shown_item)
            whole = len(pending) - len(pending) % CHUNK  # (the chunks of the whole list's)
            items += whole
            tokens += estimate_tokens(pending[:whole])
            del pending[:whole]
            yield
        out[kind] = Cost(items + len(pending), tokens + estimate_tokens(pending))
    return out

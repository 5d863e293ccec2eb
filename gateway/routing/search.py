"""Tool search's index (pure): which of a catalog's tools a few words are about, ranked by BM25.

A tool is indexed by its name, title, description and argument names, split into words
(`getUserName`, `read_text_file` and `search-docs` split at the case change, `_` and `-`),
lowercased and reduced by a light suffix rule (files -> file, listing -> list), so a query in a
model's own words meets a name in a programmer's. Name words count three times, title words
twice: a tool called what the caller asks for comes first. Each word's BM25 weight in each tool
is computed once when the index is built; a query adds up the weights of its words' postings,
so its cost is the postings it touches, not the catalog's size (docs/decisions/0059).

No library: the ones that fit (bm25s, rank-bm25) bring numpy for a few thousand short documents,
and score every document per query word; bench/search.py has the figures.
"""

from __future__ import annotations

import heapq
import math
import re
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.routing import budget
from gateway.routing.apps import app_only
from gateway.routing.table import CatalogData, RouteTable, expose_tool

# BM25's usual constants: term-frequency saturation and length normalisation.
K1 = 1.2
B = 0.75
# How many times each field's words count in a tool's document.
NAME_WEIGHT = 3
TITLE_WEIGHT = 2
# How many times more words (or tools, choosing entries) a pass takes than it takes tools to
# index: each costs about a tenth (postings: ~3 us a word; a tool's words and estimate: ~20 us).
CHEAP = 8
# Characters of a description shown in a search result: its first line, cut here.
SUMMARY_LENGTH = 160

# Words in any English request that say nothing about which tool is meant.
# fmt: off
STOP_WORDS = frozenset({
    "a", "an", "and", "any", "are", "as", "at", "be", "by", "can", "could", "do", "does",
    "for", "from", "get", "give", "how", "i", "if", "in", "into", "is", "it", "its", "me",
    "my", "of", "on", "or", "please", "should", "so", "some", "than", "that", "the", "their",
    "them", "then", "there", "these", "this", "those", "to", "tool", "tools", "use", "using",
    "want", "was", "we", "what", "when", "where", "which", "who", "will", "with", "would",
    "you", "your",
})
# fmt: on
# A run of letters (split before an upper-case letter that starts a lower-case run) or digits.
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def stem(word: str) -> str:
    """A light suffix rule, the same for tools and queries: plurals and -ing/-ed forms meet
    their stem often enough for tool names, and never merge two short words."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed") and not word.endswith("eed"):
        return word[:-2]
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """The index words of a text: split, lowercased, stop words left out, stemmed."""
    out = []
    for match in _WORD.finditer(text):
        word = match.group().lower()
        if word not in STOP_WORDS:
            out.append(stem(word))
    return out


@dataclass(frozen=True, slots=True)
class Entry:
    """One indexed tool: its client-visible name, the backend that owns it and its own name
    there (what the policy judges), and its definition as clients see it."""

    name: str
    backend: str
    own: str
    tool: dict[str, Any]


def document(tool: Mapping[str, Any]) -> list[str]:
    """The words a tool is found by, each field's as many times as it weighs."""
    out: list[str] = []
    name = tool.get("name")
    if isinstance(name, str):
        out += words(name) * NAME_WEIGHT
    title = title_of(tool)
    if title is not None:
        out += words(title) * TITLE_WEIGHT
    description = tool.get("description")
    if isinstance(description, str):
        out += words(description)
    schema = tool.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict):
        for argument in properties:
            out += words(str(argument))
    return out


def title_of(tool: Mapping[str, Any]) -> str | None:
    """A tool's title: its own, else the older `annotations.title`."""
    title = tool.get("title")
    if not isinstance(title, str):
        annotations = tool.get("annotations")
        title = annotations.get("title") if isinstance(annotations, dict) else None
    return title if isinstance(title, str) else None


class Index:
    """BM25 over one catalog, immutable once built. `postings[word]` holds the tools with the
    word and the word's BM25 weight in each (as two compact arrays)."""

    __slots__ = ("by_name", "entries", "postings", "tokens")

    def __init__(
        self,
        entries: Sequence[Entry],
        postings: dict[str, tuple[array[int], array[float]]],
        tokens: int,
    ) -> None:
        self.entries = entries
        self.postings = postings
        self.tokens = tokens  # the estimate of what listing every entry costs a model
        self.by_name = {e.name: e for e in entries}

    @classmethod
    def build(cls, entries: Sequence[Entry]) -> Index:
        """The index in one go (tests, the bench): `passes` run to the end."""
        steps = cls.passes(entries, len(entries) or 1)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                index: Index = done.value
                return index

    @classmethod
    def passes(cls, entries: Sequence[Entry], per_pass: int) -> Generator[None, None, Index]:
        """The index, built `per_pass` tools at a time: each `next` does one pass, and the last
        one's StopIteration holds the index. A caller that hands the event loop back between
        passes keeps a big catalog's build from holding requests up for longer than a pass
        (core/passes.py); the result is `build`'s, whatever `per_pass`."""
        # (a multiple of the estimate's chunk: the token estimate adds up the same way)
        per_pass = max(budget.CHUNK, per_pass - per_pass % budget.CHUNK)
        lengths: list[int] = []
        counts: dict[str, dict[int, int]] = {}
        tokens = 0
        for start in range(0, len(entries), per_pass):
            part = entries[start : start + per_pass]
            for entry in part:
                i = len(lengths)
                doc = document(entry.tool)
                lengths.append(len(doc))
                for word in doc:
                    per_doc = counts.setdefault(word, {})
                    per_doc[i] = per_doc.get(i, 0) + 1
            tokens += budget.estimate_tokens([e.tool for e in part])
            yield
        n = len(lengths)
        average = sum(lengths) / n if n else 1.0
        norms = [K1 * (1 - B + B * length / average) for length in lengths]
        postings: dict[str, tuple[array[int], array[float]]] = {}
        for done, (word, per_doc) in enumerate(counts.items(), 1):
            # BM25's idf in the form that stays positive for a word most tools have.
            idf = math.log(1 + (n - len(per_doc) + 0.5) / (len(per_doc) + 0.5))
            ids = array("i", per_doc)
            weights = array("d", (idf * f * (K1 + 1) / (f + norms[i]) for i, f in per_doc.items()))
            postings[word] = (ids, weights)
            if done % (per_pass * CHEAP) == 0:
                yield
        return cls(tuple(entries), postings, tokens)

    def search(
        self, query: str, limit: int, shown: Callable[[Entry], bool] | None = None
    ) -> list[tuple[Entry, float]]:
        """The `limit` best tools for a query that `shown` lets the caller see, best first
        (ties in catalog order); only tools matching some word of it."""
        scores: dict[int, float] = {}
        for word in set(words(query)):
            found = self.postings.get(word)
            if found is None:
                continue
            for i, weight in zip(*found, strict=True):
                scores[i] = scores.get(i, 0.0) + weight
        ranked: Iterable[tuple[float, int]] = ((-s, i) for i, s in scores.items())
        if shown is None:
            best = heapq.nsmallest(limit, ranked)
            return [(self.entries[i], -s) for s, i in best]
        out: list[tuple[Entry, float]] = []
        # Hidden tools are skipped in rank order: the caller gets `limit` of its own.
        for s, i in sorted(ranked):
            if shown(self.entries[i]):
                out.append((self.entries[i], -s))
                if len(out) == limit:
                    break
        return out

    def find(self, name: str) -> Entry | None:
        return self.by_name.get(name)


def summary(entry: Entry) -> dict[str, Any]:
    """A search result: the tool's name, title, the first line of its description, and its
    arguments' names and types (the required ones listed), enough to call it or to ask for its
    whole definition."""
    tool = entry.tool
    out: dict[str, Any] = {"name": entry.name}
    title = title_of(tool)
    if title is not None:
        out["title"] = title
    description = tool.get("description")
    if isinstance(description, str) and description.strip():
        line = description.strip().splitlines()[0]
        out["description"] = line if len(line) <= SUMMARY_LENGTH else line[:SUMMARY_LENGTH] + "…"
    schema = tool.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict) and properties:
        out["arguments"] = {
            str(k): v.get("type", "any") if isinstance(v, dict) else "any"
            for k, v in properties.items()
        }
        required = schema.get("required") if isinstance(schema, dict) else None
        if isinstance(required, list) and required:
            out["required"] = [r for r in required if isinstance(r, str)]
    return out


def entries(
    table: RouteTable, catalogs: Mapping[str, CatalogData | None], reserved: frozenset[str]
) -> tuple[list[Entry], list[str]]:
    """The tools a table's server offers, as its tools/list shows them (filters, renames,
    names), in config order; and the offered names that `reserved` (the meta-tools' names)
    shadow, which are left out. App-only tools are left out too: they are not the model's."""
    out: list[Entry] = []
    shadowed: list[str] = []
    for _ in entry_passes(table, catalogs, reserved, out, shadowed, 1 << 30):
        pass
    return out, shadowed


def entry_passes(
    table: RouteTable,
    catalogs: Mapping[str, CatalogData | None],
    reserved: frozenset[str],
    out: list[Entry],
    shadowed: list[str],
    per_pass: int,
) -> Iterator[None]:
    """`entries`, filling `out` and `shadowed` a pass at a time (one per `next`): `per_pass`
    times CHEAP tools a pass."""
    per_pass *= CHEAP
    done = 0
    for exposure in table.exposures.values():
        data = catalogs.get(exposure.backend)
        for tool in data.tools if data is not None else ():
            done += 1
            if done % per_pass == 0:
                yield
            shown = expose_tool(table.naming, exposure, tool)
            if shown is None or app_only(shown):
                continue
            route = table.tools.get(shown["name"])
            if route is None or route.backend != exposure.backend:
                continue  # a collision's loser is not offered under that name
            if shown["name"] in reserved:
                shadowed.append(shown["name"])
                continue
            out.append(Entry(shown["name"], exposure.backend, tool["name"], shown))

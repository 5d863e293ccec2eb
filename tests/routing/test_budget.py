"""The context budget's estimator (gateway/routing/budget.py): what showing a list costs a model,
held to a real tokenizer's counts of real catalogs (server/tools "Listing Tools", server/prompts,
server/resources: the list results a host shows its model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.routing.budget import KINDS, Cost, backend_costs, estimate_tokens, shown
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import CatalogData, Exposure

FIXTURE = orjson.loads((Path(__file__).parent / "budget_catalogs.json").read_bytes())
CATALOGS: dict[str, dict[str, list[dict[str, Any]]]] = FIXTURE["catalogs"]
# cl100k_base's counts of what a model is shown of each (bench/budget_calibrate.py count).
REFERENCE: dict[str, int] = FIXTURE["reference"]["tokens"]
# The error README "Context budget" states for catalogs like these.
BOUND = 0.10


def test_the_fixture_holds_the_reference_servers_catalogs() -> None:
    assert FIXTURE["reference"]["encoding"] == "cl100k_base"
    assert set(CATALOGS) == {"everything", "filesystem", "memory", "sdk", "demo"}
    assert {key.split("/")[1] for key in REFERENCE} == set(KINDS)
    assert all(CATALOGS[s][k] for s, k in (key.split("/") for key in REFERENCE))


@pytest.mark.parametrize("key", sorted(REFERENCE))
def test_each_catalog_is_estimated_within_the_bound(key: str) -> None:
    server, kind = key.split("/")
    estimate = estimate_tokens(CATALOGS[server][kind])
    assert abs(estimate - REFERENCE[key]) <= BOUND * REFERENCE[key], (estimate, REFERENCE[key])


def test_the_estimate_is_closer_than_characters_over_four() -> None:
    """The documented alternative, len/4 of the compact JSON, is off by up to 25% on these."""
    ours = chars = 0.0
    for key, tokens in REFERENCE.items():
        server, kind = key.split("/")
        items = CATALOGS[server][kind]
        ours = max(ours, abs(estimate_tokens(items) - tokens) / tokens)
        text = orjson.dumps([shown(i) for i in items]).decode()
        chars = max(chars, abs(len(text) / 4 - tokens) / tokens)
    assert ours < BOUND < chars


def test_only_what_a_model_is_shown_counts() -> None:
    """A tool's name, title, description and input schema reach the model; its output schema,
    annotations, icons and `_meta` are the host's (server/tools, Tool)."""
    tool: dict[str, Any] = {
        "name": "echo",
        "description": "Echo the text back.",
        "inputSchema": {"type": "object"},
    }
    dressed = {
        **tool,
        "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "annotations": {"readOnlyHint": True, "title": "Echo"},
        "icons": [{"src": "data:image/png;base64," + "A" * 4000}],
        "_meta": {"ui": {"resourceUri": "ui://echo/view"}},
        "execution": {"taskSupport": "optional"},
    }
    assert estimate_tokens([dressed]) == estimate_tokens([tool]) > 0
    longer = {**tool, "description": tool["description"] + " It waits for nothing at all."}
    assert estimate_tokens([longer]) > estimate_tokens([tool])


def test_an_empty_list_costs_nothing_and_more_items_cost_more() -> None:
    tools = CATALOGS["everything"]["tools"]
    assert estimate_tokens([]) == 0
    assert estimate_tokens(tools[:1]) < estimate_tokens(tools[:5]) < estimate_tokens(tools)
    # Per list or all at once: the same within a token or two per list (its brackets).
    parts = estimate_tokens(tools[:8]) + estimate_tokens(tools[8:])
    assert abs(parts - estimate_tokens(tools)) <= 2


@pytest.mark.parametrize(
    ("description", "tokens"),
    [
        # cl100k_base's counts of [{"name":"now","description":...}] (bench/budget_calibrate.py)
        ("获取当前时间并返回格式化的字符串，支持时区参数", 25),  # noqa: RUF001
        ("現在の時刻を取得して、指定されたタイムゾーンで返します", 37),
        ("Получить текущее время в указанном часовом поясе и вернуть строку", 34),
    ],
)
def test_text_beyond_ascii_is_not_counted_as_one_word(description: str, tokens: int) -> None:
    """A run of ideographs is one piece to the pre-tokenizer but many tokens: CJK and
    Cyrillic stay within 30% (README states the coarser bound for text beyond English)."""
    estimate = estimate_tokens([{"name": "now", "description": description}])
    assert abs(estimate - tokens) <= 0.3 * tokens, estimate


def test_a_lone_surrogate_is_estimated_not_raised() -> None:
    """A string holding a lone surrogate escape passes through the gateway (decision 0002);
    orjson cannot write it, so it is counted as its escape."""
    assert estimate_tokens([{"name": "odd", "description": "a \ud800 b"}]) > 0


def test_an_item_nested_past_what_can_be_written_counts_nothing_else_is_kept() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(300):
        node["x"] = {}
        node = node["x"]
    good = {"name": "echo", "description": "Echo."}
    bad = {"name": "deep", "inputSchema": deep}
    assert estimate_tokens([good, bad]) == estimate_tokens([good])


def catalog() -> CatalogData:
    lists = CATALOGS["everything"]
    return CatalogData(
        tuple(lists["tools"]),
        tuple(lists["prompts"]),
        tuple(lists["resources"]),
        tuple(lists["templates"]),
    )


def test_a_backends_costs_are_its_items_as_the_server_shows_them() -> None:
    """Filtered tools are not shown and cost nothing; namespaced names cost their prefix."""
    data = catalog()
    plain = backend_costs(Naming(PrefixMode.NEVER), Exposure("everything", "everything"), data)
    assert {kind: cost.items for kind, cost in plain.items()} == {
        "tools": len(data.tools),
        "prompts": len(data.prompts),
        "resources": len(data.resources),
        "templates": len(data.templates),
    }
    assert plain["tools"] == Cost(len(data.tools), estimate_tokens(data.tools))
    prefixed = backend_costs(Naming(PrefixMode.ALWAYS), Exposure("everything", "everything"), data)
    assert prefixed["tools"].items == plain["tools"].items
    assert prefixed["tools"].tokens > plain["tools"].tokens
    allow = (data.tools[0]["name"], data.tools[1]["name"])
    filtered = backend_costs(
        Naming(PrefixMode.NEVER), Exposure("everything", "everything", allow=allow), data
    )
    assert filtered["tools"] == Cost(2, estimate_tokens(data.tools[:2]))
    assert filtered["prompts"] == plain["prompts"]  # (tool filters filter tools)

"""Unit tests of the pure routing modules: names, cursor, merge and the route table."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.protocol import meta
from gateway.protocol.headers import ParamHeader
from gateway.routing import cursor, merge, names, table
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import CatalogData, Exposure, Route

KEY = b"k" * 32
SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def naming(mode: PrefixMode = PrefixMode.AUTO, backends: int = 2, **kw: Any) -> Naming:
    return Naming(mode=mode, backends=backends, **kw)


def tool(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "inputSchema": schema or {"type": "object"}}


def two_backends(mode: PrefixMode, catalogs: Mapping[str, CatalogData]) -> table.RouteTable:
    exposures = [Exposure("alpha", "a"), Exposure("beta", "b")]
    return table.build(naming(mode, backends=2), exposures, catalogs)


# --- names ------------------------------------------------------------------------------------


def test_prefix_always_prefixes_even_a_single_backend() -> None:
    n = naming(PrefixMode.ALWAYS, backends=1)
    assert n.prefixed
    assert names.client_name(n, "ns", "search") == "ns_search"
    assert names.client_uri(n, "ns", "file:///a.txt") == "mcp-gateway://ns/file:///a.txt"


def test_prefix_auto_prefixes_only_with_more_than_one_backend() -> None:
    one = naming(PrefixMode.AUTO, backends=1)
    two = naming(PrefixMode.AUTO, backends=2)
    assert not one.prefixed
    assert two.prefixed
    assert names.client_name(one, "ns", "search") == "search"
    assert names.client_name(two, "ns", "search") == "ns_search"
    assert names.client_uri(one, "ns", "file:///a") == "file:///a"
    assert names.client_uri(two, "ns", "file:///a") == "mcp-gateway://ns/file:///a"


def test_prefix_never_keeps_backend_names_with_many_backends() -> None:
    n = naming(PrefixMode.NEVER, backends=5)
    assert not n.prefixed
    assert names.client_name(n, "ns", "search") == "search"
    assert names.client_uri(n, "ns", "file:///a") == "file:///a"


def test_custom_separator_is_used_between_namespace_and_name() -> None:
    n = naming(PrefixMode.ALWAYS, separator=".")
    assert names.client_name(n, "ns", "search") == "ns.search"


def test_separator_inside_namespace_and_name_still_routes_by_lookup() -> None:
    n = naming(PrefixMode.ALWAYS, backends=2)
    exposures = [Exposure("b1", "my_ns"), Exposure("b2", "other")]
    catalogs = {
        "b1": CatalogData(tools=(tool("get_user_by_id"),), prompts=({"name": "a_b"},)),
        "b2": CatalogData(tools=(tool("x_y"),)),
    }
    t = table.build(n, exposures, catalogs)
    assert t.tool("my_ns_get_user_by_id") == Route("b1", "get_user_by_id")
    assert t.prompt("my_ns_a_b") == Route("b1", "a_b")
    assert t.tool("other_x_y") == Route("b2", "x_y")
    # A string split on the separator would guess these; the table does not.
    assert t.tool("my_get_user_by_id") is None
    assert t.tool("ns_get_user_by_id") is None
    assert t.collisions == []


def test_names_made_equal_by_the_separator_are_a_collision_not_a_misroute() -> None:
    n = naming(PrefixMode.ALWAYS, backends=2)
    exposures = [Exposure("b1", "a_b"), Exposure("b2", "a")]
    catalogs = {"b1": CatalogData(tools=(tool("c"),)), "b2": CatalogData(tools=(tool("b_c"),))}
    t = table.build(n, exposures, catalogs)
    assert t.tool("a_b_c") == Route("b1", "c")
    assert len(t.collisions) == 1
    assert "'b1'" in t.collisions[0] and "'b2'" in t.collisions[0]


def test_name_of_exactly_max_length_is_kept() -> None:
    n = naming(PrefixMode.NEVER, max_length=20)
    assert names.client_name(n, "ns", "x" * 20) == "x" * 20


@pytest.mark.parametrize("max_length", [16, 20, 64, 128])
def test_long_names_are_shortened_to_at_most_max_length(max_length: int) -> None:
    n = naming(PrefixMode.ALWAYS, max_length=max_length)
    for length in (max_length - 2, max_length + 1, max_length * 3):
        shown = names.client_name(n, "namespace", "t" * length)
        assert len(shown) <= max_length
        assert SAFE.match(shown)
    assert len(names.client_name(n, "namespace", "t" * (max_length * 3))) == max_length


def test_shortening_is_deterministic() -> None:
    n = naming(PrefixMode.ALWAYS, max_length=32)
    long = "a_very_long_tool_name_that_will_not_fit_anywhere"
    assert names.client_name(n, "ns", long) == names.client_name(n, "ns", long)
    again = naming(PrefixMode.ALWAYS, max_length=32)
    assert names.client_name(again, "ns", long) == names.client_name(n, "ns", long)


def test_long_names_sharing_a_prefix_stay_distinct() -> None:
    n = naming(PrefixMode.ALWAYS, max_length=32)
    common = "shared_prefix_" * 5
    first = names.client_name(n, "ns", common + "one")
    second = names.client_name(n, "ns", common + "two")
    assert first != second
    assert len(first) <= 32 and len(second) <= 32
    assert first[:20] == second[:20]


def test_shortened_names_are_routable_through_the_table() -> None:
    n = naming(PrefixMode.ALWAYS, max_length=24, backends=2)
    common = "compute_statistics_for_the_"
    long_tools = (tool(common + "north"), tool(common + "south"))
    exposures = [Exposure("b1", "ns"), Exposure("b2", "other")]
    t = table.build(n, exposures, {"b1": CatalogData(tools=long_tools)})
    for original in (common + "north", common + "south"):
        shown = table.expose_tool(n, exposures[0], tool(original))
        assert shown is not None
        visible = shown["name"]
        assert len(visible) <= 24
        assert t.tool(visible) == Route("b1", original)
    assert len(t.tools) == 2
    assert t.collisions == []


def test_unsafe_characters_are_replaced_and_hashed_apart() -> None:
    n = naming(PrefixMode.NEVER)
    spaced = names.client_name(n, "ns", "get user")
    coloned = names.client_name(n, "ns", "get:user")
    plain = names.client_name(n, "ns", "get_user")
    assert plain == "get_user"
    assert SAFE.match(spaced) and SAFE.match(coloned)
    assert spaced.startswith("get_user_")
    assert len({spaced, coloned, plain}) == 3


def test_a_name_with_a_lone_surrogate_is_hashed_like_any_unsafe_name() -> None:
    """A backend's tool name may hold a lone surrogate (valid JSON, no character)."""
    shown = names.client_name(naming(PrefixMode.NEVER), "ns", "get\ud800user")
    assert SAFE.match(shown) and shown.startswith("get_user_")


def test_unsafe_namespace_is_sanitised_too() -> None:
    n = naming(PrefixMode.ALWAYS)
    shown = names.client_name(n, "my ns", "tool")
    assert SAFE.match(shown)
    assert shown != names.client_name(n, "my_ns", "tool")


def test_sanitised_names_route_to_the_backend_name() -> None:
    n = naming(PrefixMode.NEVER, backends=1)
    exp = Exposure("only", "only")
    t = table.build(n, [exp], {"only": CatalogData(tools=(tool("héllo wörld"),))})
    shown = table.expose_tool(n, exp, tool("héllo wörld"))
    assert shown is not None and SAFE.match(shown["name"])
    assert t.tool(shown["name"]) == Route("only", "héllo wörld")
    assert t.tool("héllo wörld") is None


def test_client_uri_round_trips_through_split() -> None:
    n = naming(PrefixMode.ALWAYS)
    for uri in ("file:///tmp/a.txt", "https://example.com/x?y=1#z", "db://t/rows", ""):
        assert names.split_client_uri(names.client_uri(n, "ns-1.x", uri)) == ("ns-1.x", uri)


@pytest.mark.parametrize(
    "uri",
    [
        "file:///tmp/a.txt",
        "https://mcp-gateway/x",
        "mcp-gateway:/ns/x",
        "mcp-gateway://ns",
        "mcp-gateway:///x",
        "MCP-GATEWAY://ns/x",
        "",
    ],
)
def test_split_client_uri_rejects_other_uris(uri: str) -> None:
    assert names.split_client_uri(uri) is None


# --- cursor -----------------------------------------------------------------------------------


def test_cursor_round_trips() -> None:
    positions: list[cursor.Position] = [("alpha", "abc"), ("beta", None), ("gamma", "")]
    token = cursor.encode(positions, KEY, "tools/list")
    assert isinstance(token, str)
    assert cursor.decode(token, (KEY,), "tools/list") == positions


def test_cursor_round_trips_a_backend_cursor_with_a_lone_surrogate() -> None:
    positions: list[cursor.Position] = [("alpha", "page\ud800"), ("beta", None)]
    token = cursor.encode(positions, KEY, "tools/list")
    assert token.isascii()
    assert cursor.decode(token, (KEY,), "tools/list") == positions


def test_cursor_round_trips_an_empty_position_list() -> None:
    token = cursor.encode([], KEY, "prompts/list")
    assert cursor.decode(token, (KEY,), "prompts/list") == []


def test_cursor_with_tampered_body_is_refused() -> None:
    token = cursor.encode([("alpha", "page-2")], KEY, "tools/list")
    body, _, signature = token.rpartition(".")
    flipped = ("B" if body[0] != "B" else "C") + body[1:]
    assert cursor.decode(f"{flipped}.{signature}", (KEY,), "tools/list") is None
    assert cursor.decode(f"{body}x.{signature}", (KEY,), "tools/list") is None


def test_cursor_with_tampered_signature_is_refused() -> None:
    token = cursor.encode([("alpha", "page-2")], KEY, "tools/list")
    body, _, signature = token.rpartition(".")
    flipped = "0" if signature[-1] != "0" else "1"
    assert cursor.decode(f"{body}.{signature[:-1]}{flipped}", (KEY,), "tools/list") is None
    assert cursor.decode(f"{body}.", (KEY,), "tools/list") is None
    assert cursor.decode(body, (KEY,), "tools/list") is None
    assert cursor.decode(f"{body}.{signature.upper()}", (KEY,), "tools/list") is None


def test_cursor_for_another_list_is_refused() -> None:
    token = cursor.encode([("alpha", None)], KEY, "tools/list")
    assert cursor.decode(token, (KEY,), "resources/list") is None
    assert cursor.decode(token, (KEY,), "tools/list") == [("alpha", None)]


def test_cursor_signed_with_another_key_is_refused() -> None:
    token = cursor.encode([("alpha", None)], b"other-key", "tools/list")
    assert cursor.decode(token, (KEY,), "tools/list") is None


@pytest.mark.parametrize(
    "garbage",
    ["", ".", "..", "abc", "abc.def", "eyJwYWdlIjogM30=", "!!!.???", "a" * 500],
)
def test_garbage_cursor_strings_are_refused(garbage: str) -> None:
    assert cursor.decode(garbage, (KEY,), "tools/list") is None


@pytest.mark.parametrize("value", [None, 1, 1.5, True, [], {}, ["a", None], b"abc.def"])
def test_non_string_cursors_are_refused(value: object) -> None:
    assert cursor.decode(value, (KEY,), "tools/list") is None


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'{"v": 2, "s": "tools/list", "p": []}',
        b'{"s": "tools/list", "p": []}',
        b'{"v": 1, "s": "tools/list", "p": "x"}',
        b'{"v": 1, "s": "tools/list", "p": [["a"]]}',
        b'{"v": 1, "s": "tools/list", "p": [[1, null]]}',
        b'{"v": 1, "s": "tools/list", "p": [["a", 3]]}',
        b'{"v": 1, "s": "tools/list", "p": [{"a": null}]}',
        b"\xff\xfe",
    ],
)
def test_signed_cursor_with_malformed_payload_is_refused(payload: bytes) -> None:
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    forged = f"{body}.{cursor._sign(body, KEY)}"
    assert cursor.decode(forged, (KEY,), "tools/list") is None


@pytest.mark.parametrize("garbage", ["é.é", "abc.ü", "x.\u2603", "\ud800.abc"])
def test_non_ascii_cursor_strings_are_refused(garbage: str) -> None:
    assert cursor.decode(garbage, (KEY,), "tools/list") is None


# --- merge ------------------------------------------------------------------------------------


def test_cache_hints_take_the_smallest_ttl() -> None:
    parts = [{"ttlMs": 5000}, {"ttlMs": 300}, {"ttlMs": 60000}]
    assert merge.cache_hints(parts)["ttlMs"] == 300


@pytest.mark.parametrize(
    "odd", [{}, {"ttlMs": -1}, {"ttlMs": 0}, {"ttlMs": None}, {"ttlMs": "1000"}]
)
def test_cache_hints_treat_missing_or_negative_ttl_as_zero(odd: dict[str, Any]) -> None:
    assert merge.cache_hints([{"ttlMs": 1000}, odd])["ttlMs"] == 0
    assert merge.cache_hints([odd])["ttlMs"] == 0


def test_cache_hints_of_nothing_are_stale_and_private() -> None:
    assert merge.cache_hints([]) == {"ttlMs": 0, "cacheScope": "private"}


def test_cache_scope_is_public_only_if_every_part_is_public() -> None:
    public = {"ttlMs": 10, "cacheScope": "public"}
    private = {"ttlMs": 10, "cacheScope": "private"}
    assert merge.cache_hints([public, public])["cacheScope"] == "public"
    assert merge.cache_hints([public, private])["cacheScope"] == "private"
    assert merge.cache_hints([public, {"ttlMs": 10}])["cacheScope"] == "private"
    assert merge.cache_hints([public])["cacheScope"] == "public"


def test_capabilities_union_ors_booleans_and_merges_nested_dicts() -> None:
    first = {"tools": {"listChanged": False}, "resources": {"subscribe": True}}
    second = {
        "tools": {"listChanged": True},
        "resources": {"listChanged": True, "subscribe": False},
        "prompts": {},
        "logging": {},
    }
    merged = merge.capabilities([first, second], keep_experimental=False)
    assert merged == {
        "tools": {"listChanged": True},
        "resources": {"subscribe": True, "listChanged": True},
        "prompts": {},
        "logging": {},
    }
    # The inputs are not modified.
    assert first == {"tools": {"listChanged": False}, "resources": {"subscribe": True}}


def test_capabilities_merge_deeply_nested_dicts() -> None:
    a = {"x": {"deep": {"one": True, "flag": False}}}
    b = {"x": {"deep": {"two": 2, "flag": True}}}
    merged = merge.capabilities([a, b], keep_experimental=False)
    assert merged == {"x": {"deep": {"one": True, "two": 2, "flag": True}}}


def test_capabilities_keep_experimental_only_for_a_lone_backend() -> None:
    caps: dict[str, Any] = {"tools": {}, "extensions": {"io.x/y": {}}, "experimental": {"z": {}}}
    merged = merge.capabilities([caps], keep_experimental=False)
    assert merged == {"tools": {}, "extensions": {"io.x/y": {}}}
    kept = merge.capabilities([caps], keep_experimental=True)
    assert kept == {"tools": {}, "extensions": {"io.x/y": {}}, "experimental": {"z": {}}}


SERVER = {"name": "mcp-gateway", "version": "0"}


def test_discover_result_advertises_the_gateway_versions_and_merged_caps() -> None:
    parts: list[tuple[str, dict[str, Any]]] = [
        ("a", {"supportedVersions": ["1999-01-01"], "capabilities": {"tools": {}}, "ttlMs": 50}),
        (
            "b",
            {
                "supportedVersions": ["2000-01-01"],
                "capabilities": {"prompts": {}, "extensions": {"e": {}}},
                "ttlMs": 20,
            },
        ),
    ]
    result = merge.discover_result(parts, prefixed=True, server=SERVER)
    assert result["supportedVersions"] == list(meta.SUPPORTED_VERSIONS)
    # (extensions are merged like the other capabilities: tests/core/test_apps.py)
    assert result["capabilities"] == {"tools": {}, "prompts": {}, "extensions": {"e": {}}}
    assert result["ttlMs"] == 20
    assert result["cacheScope"] == "private"
    assert result["_meta"] == {meta.SERVER_INFO: SERVER}
    assert "instructions" not in result


def test_discover_result_combines_instructions_naming_each_namespace() -> None:
    parts: list[tuple[str, dict[str, Any]]] = [
        ("weather", {"capabilities": {}, "instructions": "Ask about the weather."}),
        ("silent", {"capabilities": {}}),
        ("files", {"capabilities": {}, "instructions": "Read files."}),
    ]
    text = merge.discover_result(parts, prefixed=True, server=SERVER)["instructions"]
    assert isinstance(text, str)
    assert "`weather`" in text and "Ask about the weather." in text
    assert "`files`" in text and "Read files." in text
    assert "silent" not in text
    assert text.index("weather") < text.index("files")


def test_discover_result_passes_a_single_unprefixed_backends_instructions_through() -> None:
    parts = [("only", {"capabilities": {"extensions": {"e": {}}}, "instructions": "Hi."})]
    result = merge.discover_result(parts, prefixed=False, server=SERVER)
    assert result["instructions"] == "Hi."
    assert result["capabilities"] == {"extensions": {"e": {}}}


def test_discover_result_names_the_namespace_of_a_single_prefixed_backend() -> None:
    parts = [("only", {"capabilities": {}, "instructions": "Hi."})]
    result = merge.discover_result(parts, prefixed=True, server=SERVER)
    assert result["instructions"] != "Hi."
    assert "`only`" in result["instructions"] and "Hi." in result["instructions"]


def test_list_result_replaces_gateway_owned_fields_of_the_base() -> None:
    base = {
        "tools": ["old"],
        "nextCursor": "backend-cursor",
        "ttlMs": 99999,
        "cacheScope": "public",
        "_meta": {"x": 1},
        "extra": "kept",
    }
    parts: list[dict[str, Any]] = [{"ttlMs": 100, "cacheScope": "public"}, {"ttlMs": 10}]
    result = merge.list_result("tools", [{"name": "t"}], parts, None, SERVER, base)
    assert result == {
        "extra": "kept",
        "resultType": "complete",
        "tools": [{"name": "t"}],
        "ttlMs": 10,
        "cacheScope": "private",
        "_meta": {meta.SERVER_INFO: SERVER},
    }


def test_list_result_carries_the_gateway_cursor() -> None:
    result = merge.list_result("prompts", [], [{"ttlMs": 5}], "next", SERVER)
    assert result["nextCursor"] == "next"
    assert result["prompts"] == []
    assert result["resultType"] == "complete"


# --- table: exposure --------------------------------------------------------------------------


def test_same_tool_and_resource_under_auto_route_to_each_backend() -> None:
    same = CatalogData(
        tools=(tool("search"),),
        prompts=({"name": "greet"},),
        resources=({"uri": "file:///readme.md", "name": "readme"},),
    )
    t = two_backends(PrefixMode.AUTO, {"alpha": same, "beta": same})
    assert t.collisions == []
    assert t.tool("a_search") == Route("alpha", "search")
    assert t.tool("b_search") == Route("beta", "search")
    assert t.tool("search") is None
    assert t.prompt("a_greet") == Route("alpha", "greet")
    assert t.prompt("b_greet") == Route("beta", "greet")
    assert t.resource("mcp-gateway://a/file:///readme.md") == Route("alpha", "file:///readme.md")
    assert t.resource("mcp-gateway://b/file:///readme.md") == Route("beta", "file:///readme.md")


def test_same_tool_and_resource_under_never_record_collisions() -> None:
    same = CatalogData(
        tools=(tool("search"),),
        prompts=({"name": "greet"},),
        resources=({"uri": "file:///readme.md", "name": "readme"},),
    )
    t = two_backends(PrefixMode.NEVER, {"alpha": same, "beta": same})
    assert t.tool("search") == Route("alpha", "search")
    assert t.resource("file:///readme.md") == Route("alpha", "file:///readme.md")
    assert len(t.collisions) == 3
    for kind, visible in (
        ("tool", "search"),
        ("prompt", "greet"),
        ("resource", "file:///readme.md"),
    ):
        matching = [c for c in t.collisions if c.startswith(kind) and repr(visible) in c]
        assert len(matching) == 1
        assert "'alpha'" in matching[0] and "'beta'" in matching[0]


def test_duplicates_within_one_backend_are_not_a_collision() -> None:
    dup = CatalogData(tools=(tool("x"), tool("x")))
    t = two_backends(PrefixMode.NEVER, {"alpha": dup})
    assert t.collisions == []
    assert t.tool("x") == Route("alpha", "x")


def test_allow_globs_keep_only_matching_tools() -> None:
    n = naming(PrefixMode.NEVER, backends=1)
    exp = Exposure("b", "b", allow=("read_*", "list"))
    catalog = CatalogData(tools=(tool("read_file"), tool("list"), tool("write_file")))
    t = table.build(n, [exp], {"b": catalog})
    assert set(t.tools) == {"read_file", "list"}
    assert table.expose_tool(n, exp, tool("write_file")) is None
    assert table.expose_tool(n, exp, tool("listing")) is None


def test_deny_globs_remove_matching_tools_even_if_allowed() -> None:
    n = naming(PrefixMode.NEVER, backends=1)
    exp = Exposure("b", "b", allow=("*_file",), deny=("write_*", "delete?file"))
    catalog = CatalogData(
        tools=(tool("read_file"), tool("write_file"), tool("delete_file"), tool("other"))
    )
    t = table.build(n, [exp], {"b": catalog})
    assert set(t.tools) == {"read_file"}
    for name in ("write_file", "delete_file", "other"):
        assert table.expose_tool(n, exp, tool(name)) is None
        assert t.tool(name) is None


def test_globs_are_case_sensitive() -> None:
    exp = Exposure("b", "b", deny=("Secret*",))
    assert not exp.tool_allowed("Secret_tool")
    assert exp.tool_allowed("secret_tool")


def test_renamed_tool_is_reachable_only_under_the_new_name() -> None:
    n = naming(PrefixMode.AUTO, backends=2)
    exps = [Exposure("alpha", "a", rename={"search": "find"}), Exposure("beta", "b")]
    t = table.build(n, exps, {"alpha": CatalogData(tools=(tool("search"),))})
    assert t.tool("a_find") == Route("alpha", "search")
    assert t.tool("a_search") is None
    shown = table.expose_tool(n, exps[0], tool("search"))
    assert shown is not None and shown["name"] == "a_find"


def test_rename_without_prefix_and_filters_apply_to_backend_names() -> None:
    n = naming(PrefixMode.NEVER, backends=1)
    exp = Exposure("b", "b", deny=("find",), rename={"search": "find"})
    t = table.build(n, [exp], {"b": CatalogData(tools=(tool("search"),))})
    assert t.tool("find") == Route("b", "search")
    assert t.tool("search") is None


def test_exposed_tool_keeps_its_other_fields_and_the_input_is_not_modified() -> None:
    n = naming(PrefixMode.ALWAYS)
    original = {"name": "t", "description": "d", "inputSchema": {"type": "object"}}
    shown = table.expose_tool(n, Exposure("b", "ns"), original)
    assert shown == {"name": "ns_t", "description": "d", "inputSchema": {"type": "object"}}
    assert original["name"] == "t"


def test_unnamed_items_are_not_exposed() -> None:
    n = naming(PrefixMode.ALWAYS)
    exp = Exposure("b", "ns")
    assert table.expose_tool(n, exp, {"inputSchema": {}}) is None
    assert table.expose_prompt(n, exp, {"name": 3}) is None
    assert table.expose(n, exp, "resources", {"name": "no uri"}) is None
    assert table.expose(n, exp, "resourceTemplates", {"uri": "file:///x"}) is None


def test_expose_dispatches_by_kind() -> None:
    n = naming(PrefixMode.ALWAYS)
    exp = Exposure("b", "ns")
    assert table.expose(n, exp, "tools", tool("t")) == tool("ns_t")
    assert table.expose(n, exp, "prompts", {"name": "p"}) == {"name": "ns_p"}
    assert table.expose(n, exp, "resources", {"uri": "file:///x"}) == {
        "uri": "mcp-gateway://ns/file:///x"
    }
    assert table.expose(n, exp, "resourceTemplates", {"uriTemplate": "db://{id}"}) == {
        "uriTemplate": "mcp-gateway://ns/db://{id}"
    }


BAD_HEADER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"q": {"type": "object", "x-mcp-header": "Query"}},
}
GOOD_HEADER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "region": {"type": "string", "x-mcp-header": "Region"},
        "opts": {
            "type": "object",
            "properties": {"limit": {"type": "integer", "x-mcp-header": "Limit"}},
        },
        "text": {"type": "string"},
    },
}


def test_strict_headers_drop_a_tool_with_an_invalid_header_annotation() -> None:
    n = naming(PrefixMode.NEVER, backends=1)
    strict = Exposure("b", "b", strict_headers=True)
    catalog = CatalogData(tools=(tool("bad", BAD_HEADER_SCHEMA), tool("good", GOOD_HEADER_SCHEMA)))
    t = table.build(n, [strict], {"b": catalog})
    assert t.tool("bad") is None
    assert t.tool("good") is not None
    assert table.expose_tool(n, strict, tool("bad", BAD_HEADER_SCHEMA)) is None
    bad_token = {
        "type": "object",
        "properties": {"q": {"type": "string", "x-mcp-header": "Bad Header"}},
    }
    assert table.expose_tool(n, strict, tool("bad2", bad_token)) is None


def test_lenient_exposure_keeps_a_tool_with_an_invalid_header_annotation() -> None:
    n = naming(PrefixMode.NEVER, backends=1)
    lenient = Exposure("b", "b")
    t = table.build(n, [lenient], {"b": CatalogData(tools=(tool("bad", BAD_HEADER_SCHEMA),))})
    assert t.tool("bad") == Route("b", "bad", ())


def test_param_headers_are_carried_in_the_route() -> None:
    n = naming(PrefixMode.ALWAYS, backends=1)
    exp = Exposure("b", "ns", strict_headers=True)
    t = table.build(n, [exp], {"b": CatalogData(tools=(tool("get", GOOD_HEADER_SCHEMA),))})
    route = t.tool("ns_get")
    assert route is not None
    assert route.backend == "b" and route.name == "get"
    assert set(route.param_headers) == {
        ParamHeader("Region", ("region",)),
        ParamHeader("Limit", ("opts", "limit"), integer=True),
    }


def test_missing_catalog_yields_an_empty_backend() -> None:
    t = two_backends(PrefixMode.AUTO, {})
    assert t.tools == {} and t.prompts == {} and t.resources == {}
    assert t.only_backend() is None


# --- table: resources -------------------------------------------------------------------------


def test_prefixed_uri_not_in_any_list_routes_by_namespace() -> None:
    catalogs = {
        "alpha": CatalogData(templates=({"uriTemplate": "file:///{+path}"},)),
        "beta": CatalogData(templates=({"uriTemplate": "db://{table}/rows"},)),
    }
    t = two_backends(PrefixMode.AUTO, catalogs)
    assert t.templates == []  # prefixed URIs route by namespace, not by template
    assert t.resource("mcp-gateway://a/file:///etc/x.txt") == Route("alpha", "file:///etc/x.txt")
    assert t.resource("mcp-gateway://b/db://users/rows") == Route("beta", "db://users/rows")


def test_prefixed_table_refuses_unknown_namespaces_and_plain_uris() -> None:
    t = two_backends(PrefixMode.AUTO, {})
    assert t.resource("mcp-gateway://zeta/file:///x") is None
    assert t.resource("mcp-gateway://alpha/file:///x") is None  # backend name, not namespace
    assert t.resource("file:///x") is None


def test_prefixed_single_backend_does_not_fall_back_for_plain_uris() -> None:
    n = naming(PrefixMode.ALWAYS, backends=1)
    t = table.build(n, [Exposure("only", "o")], {})
    assert t.resource("file:///x") is None
    assert t.resource("mcp-gateway://o/file:///x") == Route("only", "file:///x")


def test_unprefixed_uri_routes_by_template_match() -> None:
    catalogs = {
        "alpha": CatalogData(templates=({"uriTemplate": "db://{table}/rows"},)),
        "beta": CatalogData(templates=({"uriTemplate": "file:///{+path}"}, {"uriTemplate": 7}, {})),
    }
    t = two_backends(PrefixMode.NEVER, catalogs)
    assert len(t.templates) == 2
    assert t.resource("db://users/rows") == Route("alpha", "db://users/rows")
    assert t.resource("file:///a/b/c.txt") == Route("beta", "file:///a/b/c.txt")
    assert t.resource("db://users/cols") is None
    assert t.resource("http://example.com/") is None


def test_exact_resource_beats_template_match() -> None:
    catalogs = {
        "alpha": CatalogData(templates=({"uriTemplate": "file:///{+path}"},)),
        "beta": CatalogData(resources=({"uri": "file:///special"},)),
    }
    t = two_backends(PrefixMode.NEVER, catalogs)
    assert t.resource("file:///special") == Route("beta", "file:///special")
    assert t.resource("file:///other") == Route("alpha", "file:///other")


def test_single_unprefixed_backend_gets_every_uri() -> None:
    for mode in (PrefixMode.AUTO, PrefixMode.NEVER):
        t = table.build(naming(mode, backends=1), [Exposure("only", "o")], {})
        assert t.only_backend() == "only"
        assert t.resource("anything://at/all") == Route("only", "anything://at/all")
        assert t.resource("mcp-gateway://o/x") == Route("only", "mcp-gateway://o/x")


def test_template_pattern_matches_simple_expansions() -> None:
    pattern = table.template_pattern("db://{table}/rows/{id}")
    assert pattern.fullmatch("db://users/rows/42")
    assert pattern.fullmatch("db://users/rows/")
    assert not pattern.fullmatch("db://users/rows/4/2")
    assert not pattern.fullmatch("db://a/b/rows/42")
    assert not pattern.fullmatch("sql://users/rows/42")


def test_template_pattern_matches_reserved_expansion_across_slashes() -> None:
    pattern = table.template_pattern("file:///{+path}")
    assert pattern.fullmatch("file:///a/b/c.txt")
    assert pattern.fullmatch("file:///")
    assert not pattern.fullmatch("http:///a/b")
    assert not pattern.fullmatch("file://a")


def test_template_pattern_escapes_literal_text() -> None:
    pattern = table.template_pattern("a.b+c://{x}?")
    assert pattern.fullmatch("a.b+c://y?")
    assert not pattern.fullmatch("aXb+c://y?")
    assert not pattern.fullmatch("a.bbc://y")


def test_template_pattern_matches_query_and_fragment_expansions() -> None:
    assert table.template_pattern("search://items{?q,limit}").fullmatch(
        "search://items?q=x&limit=3"
    )
    assert table.template_pattern("doc://page{#section}").fullmatch("doc://page#intro")
    assert table.template_pattern("file:///x{.ext}").fullmatch("file:///x.json")


def test_template_pattern_matches_path_segment_expansion() -> None:
    assert table.template_pattern("file:///dir{/name}").fullmatch("file:///dir/report.txt")


def test_content_uris_are_rewritten_when_prefixed() -> None:
    n = naming(PrefixMode.AUTO, backends=2)
    content: list[Any] = [
        {"type": "text", "text": "hello"},
        {"type": "resource_link", "uri": "file:///a.txt", "name": "a"},
        {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "b"}},
        {"type": "image", "data": "AA==", "mimeType": "image/png"},
        "not a block",
    ]
    table.expose_content_uris(n, Exposure("alpha", "a"), content)
    assert content == [
        {"type": "text", "text": "hello"},
        {"type": "resource_link", "uri": "mcp-gateway://a/file:///a.txt", "name": "a"},
        {"type": "resource", "resource": {"uri": "mcp-gateway://a/file:///b.txt", "text": "b"}},
        {"type": "image", "data": "AA==", "mimeType": "image/png"},
        "not a block",
    ]


def test_content_uris_are_untouched_when_not_prefixed() -> None:
    n = naming(PrefixMode.NEVER, backends=2)
    content: list[Any] = [
        {"type": "resource_link", "uri": "file:///a.txt", "name": "a"},
        {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "b"}},
    ]
    snapshot = [dict(b) for b in content]
    table.expose_content_uris(n, Exposure("alpha", "a"), content)
    assert content == snapshot


def test_expose_content_uris_ignores_non_lists() -> None:
    n = naming(PrefixMode.ALWAYS)
    block = {"type": "resource_link", "uri": "file:///a"}
    table.expose_content_uris(n, Exposure("b", "ns"), block)
    assert block == {"type": "resource_link", "uri": "file:///a"}


OWN_INFO = {"name": "weather-server", "version": "2.1"}


def test_a_single_unprefixed_backend_is_shown_under_its_own_server_info() -> None:
    """Single-backend transparency (README): a client sees the backend's serverInfo."""
    parts = [("only", {"capabilities": {}, "_meta": {meta.SERVER_INFO: OWN_INFO}})]
    result = merge.discover_result(parts, prefixed=False, server=SERVER)
    assert result["_meta"] == {meta.SERVER_INFO: OWN_INFO}


@pytest.mark.parametrize(
    ("prefixed", "alone"),
    [(True, True), (False, False)],
    ids=["prefixed", "one-of-several-answered"],
)
def test_the_gateway_keeps_its_own_server_info_unless_it_serves_one_backend_unprefixed(
    prefixed: bool, alone: bool
) -> None:
    parts = [
        ("only", {"capabilities": {}, "instructions": "Hi.", "_meta": {meta.SERVER_INFO: OWN_INFO}})
    ]
    result = merge.discover_result(parts, prefixed=prefixed, server=SERVER, alone=alone)
    assert result["_meta"] == {meta.SERVER_INFO: SERVER}
    assert result["instructions"] != "Hi."


def test_a_backend_without_a_usable_server_info_leaves_the_gateways() -> None:
    parts = [("only", {"capabilities": {}, "_meta": {meta.SERVER_INFO: {"version": "1"}}})]
    result = merge.discover_result(parts, prefixed=False, server=SERVER)
    assert result["_meta"] == {meta.SERVER_INFO: SERVER}


def test_a_request_is_modern_by_the_version_in_its_meta_alone() -> None:
    """basic/versioning, Backward Compatibility with Initialization-Based Versions: a modern
    request carries its version in `_meta`; a legacy `initialize` does not, and only that one
    opens a legacy session (the transports ask this without importing the legacy wing)."""
    modern_meta = {meta.PROTOCOL_VERSION: meta.MODERN_VERSION}
    legacy_open = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    modern_init = {**legacy_open, "params": {"_meta": modern_meta}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "x"}}
    assert meta.is_legacy_opening(legacy_open)
    assert not meta.is_modern(legacy_open)
    assert meta.is_modern(modern_init) and not meta.is_legacy_opening(modern_init)
    assert not meta.is_modern(call) and not meta.is_legacy_opening(call)
    assert meta.is_modern({**call, "params": {"name": "x", "_meta": modern_meta}})

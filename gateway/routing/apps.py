"""MCP Apps (the `io.modelcontextprotocol/ui` extension) under aggregation (pure).

A tool names its UI in `_meta.ui.resourceUri` (and, in servers written before the nested form,
the deprecated flat `_meta["ui/resourceUri"]`); `_meta.ui.visibility` says whether the model,
the app (the UI the host renders for the server), or both may call it (both when absent). Under
prefixing the gateway rewrites the URIs into the ones its resources/list shows (names.client_uri),
and a view, which calls its own server's tools by their own names, is let do so (table.build:
`RouteTable.own_tools`). Everything else under `_meta` passes untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.protocol import meta

EXTENSION = "io.modelcontextprotocol/ui"
# The deprecated flat key some servers still send beside (or instead of) `_meta.ui.resourceUri`.
FLAT_RESOURCE_URI = "ui/resourceUri"
MODEL = "model"
APP = "app"

Item = dict[str, Any]


def resource_uris(tool: Mapping[str, Any]) -> list[str]:
    """The UI resource URIs a tool names (nested and flat forms), as the backend wrote them."""
    found = tool.get("_meta")
    if type(found) is not dict:
        return []
    out: list[str] = []
    ui = found.get("ui")
    if type(ui) is dict and isinstance(ui.get("resourceUri"), str):
        out.append(ui["resourceUri"])
    if isinstance(found.get(FLAT_RESOURCE_URI), str):
        out.append(found[FLAT_RESOURCE_URI])
    return out


def with_resource_uris(tool: Item, rewrite: Callable[[str], str]) -> Item:
    """The tool with its UI resource URIs rewritten (a copy; the tool itself, when it names none).
    Only those two members change: the rest of `_meta` and of `_meta.ui` is kept as it is."""
    found = tool.get("_meta")
    if type(found) is not dict:
        return tool
    fields = found
    ui = found.get("ui")
    if type(ui) is dict and isinstance(ui.get("resourceUri"), str):
        fields = {**fields, "ui": {**ui, "resourceUri": rewrite(ui["resourceUri"])}}
    flat = found.get(FLAT_RESOURCE_URI)
    if isinstance(flat, str):
        fields = {**fields, FLAT_RESOURCE_URI: rewrite(flat)}
    return tool if fields is found else {**tool, "_meta": fields}


def visibility(tool: Mapping[str, Any]) -> tuple[str, ...] | None:
    """`_meta.ui.visibility` when the tool states one (a list of strings), else None (the
    default: model and app)."""
    found = tool.get("_meta")
    ui = found.get("ui") if type(found) is dict else None
    seen = ui.get("visibility") if type(ui) is dict else None
    if type(seen) is not list:
        return None
    return tuple(v for v in seen if isinstance(v, str))


def app_only(tool: Mapping[str, Any]) -> bool:
    """A tool stated to be for the app and not the model: a host keeps it out of what the model
    is shown."""
    seen = visibility(tool)
    return seen is not None and MODEL not in seen


def app_callable(tool: Mapping[str, Any]) -> bool:
    """Whether the server's app may call the tool (default: yes)."""
    seen = visibility(tool)
    return seen is None or APP in seen


def client_declares(msg: Mapping[str, Any]) -> bool:
    """Whether the request's client declares the ui extension in its capabilities (the modern
    `_meta` field; a legacy session's are put there from its `initialize`): a host that renders
    apps and keeps app-only tools from its model itself."""
    params = msg.get("params")
    fields = params.get("_meta") if type(params) is dict else None
    caps = fields.get(meta.CLIENT_CAPABILITIES) if type(fields) is dict else None
    extensions = caps.get("extensions") if type(caps) is dict else None
    return type(extensions) is dict and type(extensions.get(EXTENSION)) is dict

"""The route table (pure): built from the backends' catalogs, it answers "where does this go?".

Immutable; a catalog refresh builds a new table. Every client-visible name comes from
`names.client_name`/`client_uri`, so lists and routing can never disagree.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol import headers, jsonrpc
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.routing import apps, names
from gateway.routing.fold import fold, folded_pattern
from gateway.routing.names import Naming

Item = dict[str, Any]


@dataclass(frozen=True)
class Exposure:
    """How one backend's catalog is shown to clients."""

    backend: str
    namespace: str
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    rename: Mapping[str, str] = field(default_factory=dict)
    # A Streamable HTTP client must leave out tools whose x-mcp-header annotations are invalid.
    strict_headers: bool = False
    # Under a policy or rate limits, whether a name or URI missing from the catalog may still be
    # forwarded for the backend to answer (config `forward_unknown`).
    forward_unknown: bool = False
    # Whether a list's first page may take the backend's part from its catalog while the
    # backend's own cache hints allow (config `lists_from_catalog`; core/fanout.py).
    lists_from_catalog: bool = True
    # A virtual server's selection of the backend's items, by their own names and URIs (names
    # or globs; None: all, (): none), on top of the filters above.
    tools: tuple[str, ...] | None = None
    prompts: tuple[str, ...] | None = None
    resources: tuple[str, ...] | None = None

    def tool_allowed(self, name: str) -> bool:
        if self.allow and not any(fnmatch.fnmatchcase(name, g) for g in self.allow):
            return False
        if self.tools is not None and not _selects(self.tools, name):
            return False
        return not any(fnmatch.fnmatchcase(name, g) for g in self.deny)

    def prompt_allowed(self, name: str) -> bool:
        return self.prompts is None or _selects(self.prompts, name)

    def resource_allowed(self, uri: str) -> bool:
        """A resource's URI or a template's uriTemplate, as the backend has it."""
        return self.resources is None or _selects(self.resources, uri)

    def withholds(self, name: str, folded: str) -> bool:
        """Whether a tool name missing from the catalog is one the filters or renames keep from
        clients, as typed or as a lenient server reads it (`folded`: routing/fold.py)."""
        if not self.tool_allowed(name) or name in self.rename or self.tools == ():
            return True
        allow, deny, renamed, chosen = self._folded_filters
        if allow is not None and allow.match(folded) is None:
            return True
        if chosen is not None and chosen.match(folded) is None:
            return True
        return (deny is not None and deny.match(folded) is not None) or folded in renamed

    @functools.cached_property
    def _folded_filters(
        self,
    ) -> tuple[
        re.Pattern[str] | None, re.Pattern[str] | None, frozenset[str], re.Pattern[str] | None
    ]:
        return (
            folded_pattern(self.allow),
            folded_pattern(self.deny),
            frozenset(map(fold, self.rename)),
            folded_pattern(self.tools or ()),
        )


def _selects(globs: tuple[str, ...], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


@dataclass(frozen=True)
class CatalogData:
    """What one backend lists; raw items as the backend sent them."""

    tools: tuple[Item, ...] = ()
    prompts: tuple[Item, ...] = ()
    resources: tuple[Item, ...] = ()
    templates: tuple[Item, ...] = ()

    @functools.cached_property
    def folded_tools(self) -> frozenset[str]:
        """The folds of every tool's name (filtered out or not): a name missing from the
        table whose fold is here is another spelling of a tool the backend has."""
        return _folds(self.tools, "name")

    @functools.cached_property
    def tools_by_name(self) -> Mapping[str, Item]:
        """Each tool by its name, the first of any it lists twice: where a policy reads a
        tool's annotations (core/policy.py), made the first time one asks."""
        return {t["name"]: t for t in reversed(self.tools) if isinstance(t.get("name"), str)}

    @functools.cached_property
    def folded_prompts(self) -> frozenset[str]:
        return _folds(self.prompts, "name")

    @functools.cached_property
    def param_headers(self) -> tuple[tuple[ParamHeader, ...] | str, ...]:
        """Each tool's `x-mcp-header` annotations (or why they are invalid), in `tools`' order:
        walked once per load, not once per server's table (most of a table's build)."""
        return tuple(headers.param_headers(t.get("inputSchema")) for t in self.tools)


def _folds(items: Sequence[Item], key: str) -> frozenset[str]:
    return frozenset(fold(i[key]) for i in items if isinstance(i.get(key), str))


@dataclass(frozen=True)
class Route:
    backend: str
    name: str  # the backend's own name or URI
    param_headers: tuple[ParamHeader, ...] = ()
    listed: bool = True  # False: not in any catalog, forwarded to the only backend as is


# --- exposing items ---------------------------------------------------------------------------


def expose_tool(
    naming: Naming,
    exp: Exposure,
    tool: Item,
    spec: tuple[ParamHeader, ...] | str | None = None,
) -> Item | None:
    """The tool as clients see it, or None when it is filtered out. `spec`: its
    `param_headers`, when the caller has them."""
    name = tool.get("name")
    if not isinstance(name, str) or not exp.tool_allowed(name):
        return None
    if exp.strict_headers:
        if spec is None:
            spec = headers.param_headers(tool.get("inputSchema"))
        if isinstance(spec, str):
            return None
    visible = names.client_name(naming, exp.namespace, exp.rename.get(name, name))
    shown = tool if visible == name else {**tool, "name": visible}
    if naming.prefixed and "_meta" in shown:
        # The UI it names, as resources/list shows it and resources/read routes it back.
        namespace = exp.namespace
        shown = apps.with_resource_uris(shown, lambda u: names.client_uri(naming, namespace, u))
    return shown


def expose_prompt(naming: Naming, exp: Exposure, prompt: Item) -> Item | None:
    name = prompt.get("name")
    if not isinstance(name, str) or (exp.prompts is not None and not exp.prompt_allowed(name)):
        return None
    visible = names.client_name(naming, exp.namespace, name)
    return prompt if visible == name else {**prompt, "name": visible}


def expose_uri_field(naming: Naming, exp: Exposure, item: Item, key: str) -> Item | None:
    uri = item.get(key)
    if not isinstance(uri, str) or (exp.resources is not None and not exp.resource_allowed(uri)):
        return None
    visible = names.client_uri(naming, exp.namespace, uri)
    return item if visible == uri else {**item, key: visible}


def expose(naming: Naming, exp: Exposure, kind: str, item: Item) -> Item | None:
    if kind == "tools":
        return expose_tool(naming, exp, item)
    if kind == "prompts":
        return expose_prompt(naming, exp, item)
    return expose_uri_field(
        naming, exp, item, "uriTemplate" if kind == "resourceTemplates" else "uri"
    )


def expose_content_uris(naming: Naming, exp: Exposure, content: object) -> None:
    """Rewrite, in place, the URIs of resource links and embedded resources in a content list."""
    if not naming.prefixed or not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        target = block.get("resource") if kind == "resource" else block
        if kind not in ("resource", "resource_link"):
            continue
        if isinstance(target, dict) and isinstance(target.get("uri"), str):
            target["uri"] = names.client_uri(naming, exp.namespace, target["uri"])


def expose_reply_uris(naming: Naming, exposure: Exposure, method: str, reply: Message) -> None:
    """Rewrite, in place, the backend URIs of a routed request's reply as clients know them."""
    result = reply.get("result")
    if not isinstance(result, dict):
        return
    jsonrpc.changed(reply)  # the URIs below are rewritten in place
    if method == "tools/call":
        expose_content_uris(naming, exposure, result.get("content"))
    elif method == "prompts/get":
        for message in result.get("messages") or ():
            if isinstance(message, dict):
                content = message.get("content")
                blocks = content if isinstance(content, list) else [content]
                expose_content_uris(naming, exposure, blocks)
    elif method == "resources/read":
        for item in result.get("contents") or ():
            if isinstance(item, dict) and isinstance(item.get("uri"), str):
                item["uri"] = names.client_uri(naming, exposure.namespace, item["uri"])


# --- the table --------------------------------------------------------------------------------


class RouteTable:
    def __init__(self, naming: Naming, exposures: Sequence[Exposure]) -> None:
        self.naming = naming
        self.exposures = {e.backend: e for e in exposures}
        self.namespaces = {e.namespace: e for e in exposures}
        self.tools: dict[str, Route] = {}
        self.prompts: dict[str, Route] = {}
        self.resources: dict[str, Route] = {}
        self.templates: list[tuple[re.Pattern[str], str]] = []  # unprefixed only
        self.backend_templates: dict[str, list[re.Pattern[str]]] = {}  # by backend, any mode
        # Under prefixing, a backend's own tool name -> the client-visible names it is offered
        # under, for the tools an app view of that backend may call by their own names (build).
        self.own_tools: dict[str, tuple[str, ...]] = {}
        self.collisions: list[str] = []
        self.shortened: list[str] = []  # names changed to fit the spec's characters and length

    def _add(self, table: dict[str, Route], kind: str, visible: str, route: Route) -> None:
        held = table.get(visible)
        if held is None:
            table[visible] = route
        elif held.backend != route.backend:
            self.collisions.append(
                f"{kind} {visible!r} is offered by both {held.backend!r} and {route.backend!r}"
            )

    def _note_shortened(self, exp: Exposure, name: str, visible: str) -> None:
        plain = f"{exp.namespace}{self.naming.separator}{name}" if self.naming.prefixed else name
        if visible != plain:
            self.shortened.append(f"{exp.backend}: {plain!r} is shown as {visible!r}")

    def tool(self, visible: str) -> Route | None:
        return self.tools.get(visible)

    def own_tool(self, own: str) -> Route | None:
        """Where an app view's call by its server's own tool name goes, when it is the own name
        of one offered tool only (core/apps.py)."""
        shown = self.own_tools.get(own)
        return self.tools[shown[0]] if shown is not None and len(shown) == 1 else None

    def prompt(self, visible: str) -> Route | None:
        return self.prompts.get(visible)

    def resource(self, visible: str) -> Route | None:
        """Exact URIs first; then a namespaced URI by its namespace; then template matches."""
        exact = self.resources.get(visible)
        if exact is not None:
            return exact
        if self.naming.prefixed:
            split = names.split_client_uri(visible)
            exp = self.namespaces.get(split[0]) if split is not None else None
            if split is None or exp is None:
                return None
            if exp.resources is not None and not self._offers(exp, split[1]):
                return None
            return Route(exp.backend, split[1])
        for pattern, backend in self.templates:
            if pattern.fullmatch(visible):
                return Route(backend, visible)
        if len(self.exposures) == 1:
            exp = next(iter(self.exposures.values()))
            return Route(exp.backend, visible) if self._offers(exp, visible) else None
        return None

    def _offers(self, exp: Exposure, uri: str) -> bool:
        """Whether a virtual server's selection takes a URI no catalog lists: by the resource
        globs, or as one of the selected templates' URIs."""
        if exp.resources is None or exp.resource_allowed(uri):
            return True
        return _any_match(self.backend_templates.get(exp.backend, ()), uri)

    def listed_resource(self, visible: str) -> Route | None:
        """`resource` without the guesses: only a URI a backend lists, or one of its templates
        matches (what a policy or rate limits let through without `forward_unknown`)."""
        exact = self.resources.get(visible)
        if exact is not None:
            return exact
        if self.naming.prefixed:
            split = names.split_client_uri(visible)
            exp = self.namespaces.get(split[0]) if split is not None else None
            if split is None or exp is None:
                return None
            # (the other wrapper's spelling of a listed ui:// URI: the same resource)
            exact = self.resources.get(names.client_uri(self.naming, split[0], split[1]))
            if exact is not None:
                return exact
            patterns = self.backend_templates.get(exp.backend, ())
            return Route(exp.backend, split[1]) if _any_match(patterns, split[1]) else None
        for pattern, backend in self.templates:
            if pattern.fullmatch(visible):
                return Route(backend, visible)
        return None

    def only_backend(self) -> str | None:
        return next(iter(self.exposures)) if len(self.exposures) == 1 else None


def build(
    naming: Naming, exposures: Sequence[Exposure], catalogs: Mapping[str, CatalogData]
) -> RouteTable:
    table = RouteTable(naming, exposures)
    for exp in exposures:
        catalog = catalogs.get(exp.backend, CatalogData())
        for tool, spec in zip(catalog.tools, catalog.param_headers, strict=True):
            shown = expose_tool(naming, exp, tool, spec)
            if shown is not None:
                table._note_shortened(
                    exp, exp.rename.get(tool["name"], tool["name"]), shown["name"]
                )
                route = Route(exp.backend, tool["name"], spec if isinstance(spec, tuple) else ())
                table._add(table.tools, "tool", shown["name"], route)
        for prompt in catalog.prompts:
            shown = expose_prompt(naming, exp, prompt)
            if shown is not None:
                table._note_shortened(exp, prompt["name"], shown["name"])
                table._add(
                    table.prompts, "prompt", shown["name"], Route(exp.backend, prompt["name"])
                )
        for resource in catalog.resources:
            shown = expose_uri_field(naming, exp, resource, "uri")
            if shown is not None:
                route = Route(exp.backend, resource["uri"])
                table._add(table.resources, "resource", shown["uri"], route)
        patterns = [
            template_pattern(t["uriTemplate"])
            for t in catalog.templates
            if isinstance(t.get("uriTemplate"), str) and exp.resource_allowed(t["uriTemplate"])
        ]
        table.backend_templates[exp.backend] = patterns
        if not naming.prefixed:
            table.templates.extend((p, exp.backend) for p in patterns)
    if naming.prefixed:
        table.own_tools = _own_tools(naming, exposures, catalogs, table.tools)
    return table


def _own_tools(
    naming: Naming,
    exposures: Sequence[Exposure],
    catalogs: Mapping[str, CatalogData],
    visible: Mapping[str, Route],
) -> dict[str, tuple[str, ...]]:
    """The own names an app view may call its server's tools by: only of backends with a UI
    (an offered tool naming a UI resource), only tools offered to clients whose visibility lets
    the app call them, and never a name that is a client-visible name (which always wins)."""
    found: dict[str, list[str]] = {}
    for exp in exposures:
        offered = [
            (tool, shown)
            for tool in catalogs.get(exp.backend, CatalogData()).tools
            if (shown := expose_tool(naming, exp, tool)) is not None
        ]
        if not any(apps.resource_uris(tool) for tool, _ in offered):
            continue
        for tool, shown in offered:
            own, name = tool["name"], shown["name"]
            route = visible.get(name)
            if route is None or route.backend != exp.backend or not apps.app_callable(tool):
                continue  # (a collision's loser is not offered under that name)
            found.setdefault(own, []).append(name)
    return {own: tuple(shown) for own, shown in found.items() if own not in visible}


def _any_match(patterns: Sequence[re.Pattern[str]], uri: str) -> bool:
    return any(p.fullmatch(uri) for p in patterns)


_EXPRESSION = re.compile(r"\{([+#./;?&]?)([^}]*)\}")


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex matching the URIs an RFC 6570 template can expand to (good enough for routing)."""
    out: list[str] = []
    last = 0
    for m in _EXPRESSION.finditer(template):
        out.append(re.escape(template[last : m.start()]))
        operator = m.group(1)
        if operator in ("+", "#", "?", "&"):
            out.append(".*")
        elif operator == "/":
            out.append("(?:/[^/?#]*)*")  # path segments: each expansion starts with "/"
        else:
            out.append("[^/?#]*")
        last = m.end()
    out.append(re.escape(template[last:]))
    return re.compile("".join(out))

"""The config's objects of the `servers:` section: virtual servers, each an endpoint of its own
made of a selection of the shared backends (a leaf, like model.py)."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.config.access import PolicyConfig
from gateway.config.key import NAME_PATTERN, URL_PATTERN, key
from gateway.config.operations import RateLimits
from gateway.config.search import ToolSearchConfig

if TYPE_CHECKING:
    from gateway.config.model import Namespacing

# What the merged server (`/mcp`, stdio) is called where servers are named (metrics, the status
# page, check-config): no virtual server may take it.
MERGED_SERVER = "default"
# The capabilities a selection can leave empty, by the lists they name.
SELECTION_CAPABILITIES = {"tools": "tools", "prompts": "prompts", "resources": "resources"}


def selected(patterns: tuple[str, ...] | None, name: str) -> bool:
    """Whether a selection (None: everything; names or globs, `[]`: nothing) takes `name`."""
    return patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True)
class ServerBackend:
    """One backend as a virtual server shows it: which of its items, under which names."""

    name: str  # the backend's name in `backends:`
    # None (the key absent): every item; a list of names or globs: those only; []: none.
    tools: tuple[str, ...] | None = key(
        "strings",
        "Tools offered, by the backend's own names or globs (absent: all; []: none).",
        None,
    )
    prompts: tuple[str, ...] | None = key(
        "strings", "Prompts offered, by name or glob (absent: all; []: none).", None
    )
    resources: tuple[str, ...] | None = key(
        "strings",
        "Resources and templates offered, by URI or glob (absent: all; []: none).",
        None,
    )
    rename: Mapping[str, str] = key(
        "string_map",
        "Tool names, as the backend has them, to the names this server offers.",
        factory=dict,
    )
    namespace: str = key(
        "string",
        "Prefix of this backend's names in this server (default: the backend's).",
        "",
        pattern=NAME_PATTERN,
    )

    @property
    def hidden(self) -> frozenset[str]:
        """The capabilities this server shows nothing of (a selection of `[]`): their list
        changes are not its clients' business, and discovery does not advertise them."""
        return frozenset(
            cap for kind, cap in SELECTION_CAPABILITIES.items() if getattr(self, kind) == ()
        )


@dataclass(frozen=True)
class ServerAuth:
    """A virtual server's own requirements on the callers' tokens (under the top-level `auth:`,
    which says how tokens are checked)."""

    resource: str = key(
        "string",
        "This endpoint's canonical URI (default: auth.resource's origin and this server's path).",
        "",
        pattern=URL_PATTERN,
    )
    audience: str = key(
        "string",
        "The aud a token must contain (default: auth.audience if set, else this resource).",
        "",
    )
    scopes: tuple[str, ...] = key(
        "strings", "Scopes every token must carry here, beyond auth.required_scopes.", ()
    )
    scopes_supported: tuple[str, ...] = key(
        "strings", "Scopes listed in this endpoint's protected resource metadata.", ()
    )


@dataclass(frozen=True)
class ServerConfig:
    """One virtual server: an MCP server of its own, at its own path, over the shared backends."""

    name: str
    path: str = key(
        "string", "Its path on listen.http (default: listen.http.path + /NAME).", "", shown=None
    )
    backends: tuple[ServerBackend, ...] = key(
        "sections",
        "The backends it offers, by name, each with its selection ({}: all of it).",
        section="server_backend",
        factory=tuple,
    )
    namespacing: Namespacing | None = key(
        "section",
        "How its names are prefixed (default: the top level's).",
        None,
        section="namespacing",
    )
    instructions: str | None = key(
        "string", "The instructions its discovery gives (default: the backends').", None
    )
    server_name: str = key(
        "string", "Its serverInfo name (default: the server's name).", "", shown=None
    )
    tool_search: ToolSearchConfig | None = key(
        "section",
        "Its tool search: the meta-tools instead of its tools (default: the top level's).",
        None,
        section="tool_search",
    )
    auth: ServerAuth | None = key(
        "section",
        "Its own token requirements (with the top-level auth:).",
        None,
        section="server_auth",
    )
    policy: PolicyConfig | None = key(
        "section", "Its own policy, instead of the top-level one.", None, section="policy"
    )
    rate_limits: RateLimits | None = key(
        "section",
        "Its own rate limits, instead of sharing the top-level ones' buckets.",
        None,
        section="rate_limits",
    )

    @functools.cached_property
    def selection(self) -> Mapping[str, ServerBackend]:
        return {b.name: b for b in self.backends}

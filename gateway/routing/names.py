"""Client-visible names and URIs of a backend's tools, prompts and resources (pure).

A name is `{namespace}{separator}{name}` when prefixing is on, kept inside the character set the
spec recommends for tool names, and shortened with a hash suffix when longer than the limit. The
mapping back is always a table lookup built from these same functions, never a string split.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
from dataclasses import dataclass

URI_SCHEME = "mcp-gateway"
_URI_PREFIX = f"{URI_SCHEME}://"
# MCP Apps UI resources (io.modelcontextprotocol/ui): namespaced inside their own scheme.
UI_PREFIX = "ui://"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
# Hex digits of the hash that keeps a shortened or sanitised name unique.
HASH_LENGTH = 8


class PrefixMode(enum.Enum):
    ALWAYS = "always"
    AUTO = "auto"
    NEVER = "never"


@dataclass(frozen=True)
class Naming:
    mode: PrefixMode = PrefixMode.AUTO
    separator: str = "_"
    max_length: int = 64
    backends: int = 1

    @functools.cached_property
    def prefixed(self) -> bool:
        return self.mode is PrefixMode.ALWAYS or (
            self.mode is PrefixMode.AUTO and self.backends > 1
        )


def client_name(naming: Naming, namespace: str, name: str) -> str:
    """The name a client sees for a backend's tool or prompt `name`."""
    full = f"{namespace}{naming.separator}{name}" if naming.prefixed else name
    safe = _UNSAFE.sub("_", full)
    if safe == full and len(full) <= naming.max_length:
        return full
    # (surrogatepass: a backend's name may hold a lone surrogate, which JSON allows)
    key = f"{namespace}\0{name}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(key).hexdigest()[:HASH_LENGTH]
    return f"{safe[: naming.max_length - HASH_LENGTH - 1]}_{digest}"


def client_prefix(naming: Naming, namespace: str) -> str:
    """What every client-visible name of a namespace's tools and prompts begins with under
    prefixing (shortened names too: they keep the start of the sanitised name)."""
    return _UNSAFE.sub("_", f"{namespace}{naming.separator}")[: naming.max_length - HASH_LENGTH - 1]


def client_uri(naming: Naming, namespace: str, uri: str) -> str:
    """A backend's resource URI (or URI template) as clients see it."""
    if not naming.prefixed:
        return uri
    if uri.startswith(UI_PREFIX):
        return f"{UI_PREFIX}{namespace}/{uri[len(UI_PREFIX) :]}"
    return f"{_URI_PREFIX}{namespace}/{uri}"


def split_client_uri(uri: str) -> tuple[str, str] | None:
    """(namespace, backend URI) of a prefixed client URI; None for any other URI.

    Both wrappers are exact (case and all): a URI in any other spelling names no namespace and
    is unknown, never another backend's. `mcp-gateway://{ns}/ui://...` still splits (to the
    same backend URI the `ui://{ns}/...` form names), so both are judged alike."""
    if uri.startswith(UI_PREFIX):
        namespace, slash, rest = uri[len(UI_PREFIX) :].partition("/")
        return (namespace, UI_PREFIX + rest) if slash and namespace else None
    if not uri.startswith(_URI_PREFIX):
        return None
    namespace, slash, rest = uri[len(_URI_PREFIX) :].partition("/")
    return (namespace, rest) if slash and namespace else None

"""Merging what several backends answered into one result (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.protocol import meta

Result = dict[str, Any]

LIST_KEYS: Mapping[str, str] = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}
# The capability a backend must declare for each list to be asked of it.
LIST_CAPABILITY: Mapping[str, str] = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resources",
}


def cache_hints(parts: Sequence[Result]) -> dict[str, Any]:
    """The smallest `ttlMs`, and `public` only if every part was (server/utilities/caching)."""
    ttls = [p.get("ttlMs") for p in parts]
    ttl = min((t if type(t) is int and t > 0 else 0) for t in ttls) if ttls else 0
    public = bool(parts) and all(p.get("cacheScope") == "public" for p in parts)
    return {"ttlMs": ttl, "cacheScope": "public" if public else "private"}


def list_result(
    key: str,
    items: list[Any],
    parts: Sequence[Result],
    next_cursor: str | None,
    server: Result,
    base: Result | None = None,
) -> Result:
    """One page of a merged list. `base` (a lone backend's own result) keeps fields the gateway
    does not own."""
    result: Result = {**(base or {}), "resultType": "complete", key: items, **cache_hints(parts)}
    result.pop("nextCursor", None)
    if next_cursor is not None:
        result["nextCursor"] = next_cursor
    result["_meta"] = {meta.SERVER_INFO: server}
    return result


def capabilities(parts: Sequence[Result], *, keep_experimental: bool) -> Result:
    """The union of backend capabilities: each is advertised if some backend has it.

    `extensions` are merged like the rest (docs/behaviour/protocol.md, Extensions): every
    extension some backend declares, its settings merged key by key where they are objects,
    lists unioned (in order, without repeats), a flag true if any backend's is, and any other
    disagreement settled by the first backend in config order. `experimental` is kept only for
    a lone backend: its shape is unspecified, and what it offers may be methods the gateway
    routes to no backend of several."""
    merged: Result = {}
    for caps in parts:
        for name, value in caps.items():
            if name == "experimental" and not keep_experimental:
                continue
            if isinstance(value, dict) and isinstance(merged.get(name), dict):
                merged[name] = _union(merged[name], value)
            elif name not in merged:
                merged[name] = _union({}, value) if isinstance(value, dict) else value
    return merged


def _union(a: Result, b: Result) -> Result:
    out = dict(a)
    for key, value in b.items():
        held = out.get(key)
        if isinstance(held, bool) and isinstance(value, bool):
            out[key] = held or value
        elif isinstance(held, dict) and isinstance(value, dict):
            out[key] = _union(held, value)
        elif isinstance(held, list) and isinstance(value, list):
            out[key] = held + [v for v in value if v not in held]
        elif key not in out:
            out[key] = _union({}, value) if isinstance(value, dict) else value
    return out


def discover_result(
    parts: Sequence[tuple[str, Result]], *, prefixed: bool, server: Result, alone: bool = True
) -> Result:
    """One discovery result for the merged server, from (namespace, backend result) pairs.

    `alone`: the gateway serves this one backend only. Unprefixed, it is then that server to a
    client, as if reached directly: its own serverInfo and instructions (decision 0015,
    single-backend transparency). Otherwise the gateway is the server a client sees, under
    `server`."""
    transparent = alone and len(parts) == 1 and not prefixed
    results = [r for _, r in parts]
    caps = [r["capabilities"] for r in results if isinstance(r.get("capabilities"), dict)]
    result: Result = {
        "resultType": "complete",
        "supportedVersions": list(meta.SUPPORTED_VERSIONS),
        "capabilities": capabilities(caps, keep_experimental=len(parts) == 1),
        **cache_hints(results),
        "_meta": {meta.SERVER_INFO: (transparent and _server_info(results[0])) or server},
    }
    texts = [(ns, r["instructions"]) for ns, r in parts if isinstance(r.get("instructions"), str)]
    if transparent and texts:
        result["instructions"] = texts[0][1]
    elif texts:
        result["instructions"] = "\n\n".join(
            f"Tools, prompts and resources of `{ns}` (namespace `{ns}`):\n{text}"
            for ns, text in texts
        )
    return result


def _server_info(result: Result) -> Result | None:
    found = result.get("_meta")
    info = found.get(meta.SERVER_INFO) if isinstance(found, dict) else None
    return info if isinstance(info, dict) and isinstance(info.get("name"), str) else None

"""The forward proxy the environment names for a destination (HTTP_PROXY, HTTPS_PROXY,
NO_PROXY and their lowercase spellings).

These are the rules of aiohttp's `trust_env`, from the same standard-library calls, applied
once per destination: `trust_env` looks the proxy up per request in a worker thread and reads
~/.netrc each time, which cost 4.7x the client's CPU per request in our measurement. Proxy
credentials go in the proxy URL; ~/.netrc is never read, so no credential the config does not
name reaches a destination or a proxy.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from yarl import URL


@dataclass(frozen=True)
class Proxy:
    url: str
    shown: str  # the URL without its credentials, for log lines
    usable: bool  # an http:// proxy (TLS to the proxy would be TLS in TLS, as trust_env says)


def named_proxy(url: URL) -> Proxy | None:
    """The proxy the environment names for `url`, unless NO_PROXY exempts its host."""
    if url.host is None or urllib.request.proxy_bypass(url.host):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    if not proxy:
        return None
    parsed = URL(proxy)
    return Proxy(proxy, str(parsed.with_user(None)), parsed.scheme == "http")

"""The forward proxy the environment names for a destination (HTTP_PROXY, HTTPS_PROXY,
NO_PROXY and their lowercase spellings), for HTTP backends and the OTLP exporter alike.

These are the rules of aiohttp's `trust_env`, from the same standard-library calls, applied
once per destination: `trust_env` looks the proxy up per request in a worker thread and reads
~/.netrc each time, which cost 4.7x the client's CPU per request in our measurement. Proxy
credentials go in the proxy URL; ~/.netrc is never read, so no credential the config does not
name reaches a destination or a proxy.
"""

from __future__ import annotations

import logging
import urllib.request

from yarl import URL

log = logging.getLogger("gateway.proxies")


def env_proxy(url: URL, who: str) -> str | None:
    """The proxy to reach `url` through, unless NO_PROXY exempts its host; `who` goes to the
    one log line that says which (never with the proxy's credentials)."""
    if url.host is None or urllib.request.proxy_bypass(url.host):
        return None
    proxy = urllib.request.getproxies().get(url.scheme)
    if not proxy:
        return None
    parsed = URL(proxy)
    shown = parsed.with_user(None)
    if parsed.scheme != "http":
        # As trust_env: http:// proxies only (TLS to the proxy would be TLS in TLS).
        log.warning("%s: ignoring proxy %s (only http:// proxies)", who, shown)
        return None
    log.info("%s: through proxy %s", who, shown)
    return proxy

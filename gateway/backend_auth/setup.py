"""An `Authorizer` from a backend's config: the HTTP client of its authorization server and the
token store, with their limits. The OAuth client is imported only for a backend with `auth:`
(docs/decisions/0064-lazy-imports.md): the transports call this for every HTTP backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway import __version__
from gateway.config import BackendConfig, HttpTarget, SseTarget

if TYPE_CHECKING:
    from gateway.backend_auth.authorizer import Authorizer

# One request to an authorization server or for a metadata document, in seconds.
FETCH_TIMEOUT = 10.0
# A metadata document, registration or token answer larger than this is refused: they are small.
MAX_RESPONSE_BYTES = 256 * 1024


def authorizer(config: BackendConfig) -> Authorizer | None:
    if config.auth is None:
        return None
    from gateway.backend_auth.authorizer import Authorizer
    from gateway.backend_auth.fetch import OAuthHttp
    from gateway.backend_auth.store import TokenStore, state_dir

    assert isinstance(config.target, HttpTarget | SseTarget)
    http = OAuthHttp(FETCH_TIMEOUT, MAX_RESPONSE_BYTES, f"mcp-gateway/{__version__}")
    return Authorizer(
        config.name,
        config.target.url,
        config.auth,
        http,
        TokenStore(state_dir()),
        wait_bound=config.connect_timeout,
    )

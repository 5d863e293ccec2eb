"""Why no authorization server is known, told truly (issue 36): a backend whose protected
resource metadata exists but lists no `authorization_servers` (a gateway protected by API keys
serves such a document) is not said to have no metadata; and the way to pin one is named both
as the config key and as `connect`'s flag (basic/authorization, Authorization Server Discovery;
RFC 9728 `authorization_servers`)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backend_auth.discovery import DiscoveryFailed, discover
from gateway.backend_auth.fetch import FetchFailed, Reply

pytestmark = pytest.mark.anyio
BACKEND = "http://127.0.0.1:9/mcp"
WELL_KNOWN = "http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp"


class Documents:
    """The OAuth client's GETs answered from a table (what the servers would serve)."""

    def __init__(self, documents: dict[str, dict[str, Any]]) -> None:
        self.documents = documents

    async def get(self, url: str) -> Reply:
        if url not in self.documents:
            raise FetchFailed(url, "HTTP 404")
        return Reply(200, self.documents[url])


async def failure(documents: dict[str, dict[str, Any]]) -> DiscoveryFailed:
    with pytest.raises(DiscoveryFailed) as failed:
        await discover(Documents(documents), BACKEND, None, None)  # type: ignore[arg-type]
    return failed.value


async def test_metadata_without_authorization_servers_is_told_as_such() -> None:
    found = await failure({WELL_KNOWN: {"resource": BACKEND}})
    assert found.no_issuer
    assert f"its protected resource metadata ({WELL_KNOWN}) lists no" in str(found)
    assert "no protected resource metadata" not in str(found)
    assert "auth.authorization_server" in str(found) and "--authorization-server" in str(found)
    assert "pin one" not in found.detail  # (what the CLI words its own way)


async def test_no_metadata_at_all_is_told_as_such() -> None:
    found = await failure({})
    assert found.no_issuer and "no protected resource metadata found" in str(found)


async def test_other_failures_are_not_for_want_of_an_issuer() -> None:
    other = {"resource": "http://127.0.0.1:9/elsewhere", "authorization_servers": ["x"]}
    found = await failure({WELL_KNOWN: other})
    assert not found.no_issuer and found.detail == str(found)

"""The OAuth client's HTTP towards authorization servers and metadata documents.

Every URL here came from a server (a challenge, protected resource metadata, authorization
server metadata), so each is checked before it is fetched: https, or http on loopback only, and
redirects are never followed, so a server cannot steer the gateway to another host (SSRF).
Bounded in time and size; nothing is retried (a token request may have been granted)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.backend_auth.wire import outbound_problem
from gateway.capped import TooLarge, read_capped

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


class FetchFailed(Exception):
    """A server could not be asked, or refused: the message names the URL and why, never a
    credential."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"{url}: {why}")
        self.url = url


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any  # the decoded JSON, or None when the body was not JSON


class OAuthHttp:
    def __init__(self, timeout: float, max_bytes: int, user_agent: str) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_bytes = max_bytes
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, within the running loop, and never for a backend that needs none.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={"Accept": JSON, "User-Agent": self._user_agent},
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return self._session

    async def get(self, url: str) -> Reply:
        return await self._send("GET", url, None, {})

    async def post_form(self, url: str, form: dict[str, str], headers: dict[str, str]) -> Reply:
        return await self._send("POST", url, form, headers)

    async def post_json(self, url: str, body: dict[str, Any]) -> Reply:
        return await self._send("POST", url, orjson.dumps(body), {"Content-Type": JSON})

    async def _send(
        self, method: str, url: str, data: dict[str, str] | bytes | None, headers: dict[str, str]
    ) -> Reply:
        if (why := outbound_problem(url)) is not None:
            raise FetchFailed(url, why)
        try:
            async with self._client().request(
                method, url, data=data, headers=headers, allow_redirects=False
            ) as reply:
                body = await read_capped(reply, self._max_bytes)
                status = reply.status
        except TooLarge as exc:
            raise FetchFailed(url, str(exc)) from None
        except TimeoutError:
            raise FetchFailed(url, "timed out") from None
        except aiohttp.ClientError as exc:
            raise FetchFailed(url, type(exc).__name__) from None
        except OSError as exc:
            raise FetchFailed(url, exc.strerror or type(exc).__name__) from None
        try:
            return Reply(status, orjson.loads(body) if body else None)
        except orjson.JSONDecodeError:
            return Reply(status, None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

"""The gateway's HTTP client towards the authorization server: GET a JSON document (metadata,
JWKS), POST a form (introspection). One aiohttp session, bounded in time and size; redirects
are not followed (a document must come from the URL that names it) and nothing is retried.
The only module of the package that speaks HTTP."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson

from gateway.capped import TooLarge, read_capped

log = logging.getLogger("gateway.caller_auth")

JSON = "application/json"


class FetchFailed(Exception):
    """The authorization server could not be asked: unreachable, slow, an error status, not
    JSON, too large. The message names the URL and why, never a credential."""

    def __init__(self, url: str, why: str, status: int | None = None) -> None:
        super().__init__(f"{url}: {why}")
        self.status = status


class Fetcher:
    def __init__(self, timeout: float, max_bytes: int) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: within the running loop, and not at all for API keys alone.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={"Accept": JSON, "Accept-Encoding": "identity"},
                trust_env=False,
            )
        return self._session

    async def get_json(self, url: str) -> Any:
        return await self._send("GET", url, None, None)

    async def post_form(self, url: str, form: dict[str, str], authorization: str) -> Any:
        return await self._send("POST", url, form, {"Authorization": authorization})

    async def _send(
        self,
        method: str,
        url: str,
        form: dict[str, str] | None,
        headers: dict[str, str] | None,
    ) -> Any:
        try:
            async with self._client().request(
                method, url, data=form, headers=headers, allow_redirects=False
            ) as reply:
                if reply.status != 200:
                    raise FetchFailed(url, f"HTTP {reply.status}", reply.status)
                body = await read_capped(reply, self._max_bytes)
        except TooLarge as exc:
            raise FetchFailed(url, str(exc)) from None
        except TimeoutError:
            raise FetchFailed(url, "timed out") from None
        except aiohttp.ClientError as exc:
            raise FetchFailed(url, type(exc).__name__) from None
        except OSError as exc:
            raise FetchFailed(url, exc.strerror or type(exc).__name__) from None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise FetchFailed(url, "not JSON") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

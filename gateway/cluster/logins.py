"""`oauth.shared.SharedStore` in Redis: the cluster's backend logins (tokens, registrations) and
the per-user logins in progress, sealed.

Every value is sealed with AES-256-GCM under a key derived from `cluster.secrets`
(`oauth.shared.PURPOSE`): sealed with the first key, opened with any (so the secrets rotate as
the cursors' do), with the Redis key name as associated data, so a record moved under another
key (someone else's token, another login) does not open. Key names carry digests only: who
reads Redis learns how many logins there are, not whose, for which backend, or a login id or
`state` (THREAT_MODEL.md, "Redis").

Each operation is bounded by `timeout` (connecting included) and never retried inside
redis-py: a login step or a token lookup that Redis cannot serve fails at once with
`StoreUnavailable`, which the OAuth client turns into its usual errors (-31001, or the login
page's 503). A change of state (failing, answering again) is logged once, without the URL.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from redis.asyncio import Redis

from gateway.backend_auth.shared import Key, Record, StoreUnavailable
from gateway.cluster.connection import connect
from gateway.cluster.outage import Breaker, RedisDown

log = logging.getLogger("gateway.backend_auth")

PREFIX = "mcp-gateway:oauth:"
# A sealed value: this version byte, a 96-bit random nonce, then AES-GCM's ciphertext and tag.
VERSION = b"\x01"
NONCE_BYTES = 12
# A renewal lock is released by its holder only (a holder that overran its time must not
# release the next one's).
UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# Keys deleted per SCAN page by `forget`.
SCAN_COUNT = 500

T = TypeVar("T")


def digest(*parts: str) -> str:
    """A bounded, one-way name for what a key is about (a URL, a user, a login id, a state)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def token_key(key: Key) -> str:
    return f"{PREFIX}token:{digest(key.resource)}:{digest(key.client, key.user)}"


def lock_key(key: Key) -> str:
    return f"{PREFIX}lock:{digest(key.resource)}:{digest(key.client, key.user)}"


def registration_key(resource: str, client: str) -> str:
    return f"{PREFIX}registration:{digest(resource)}:{digest(client)}"


def login_key(login_id: str) -> str:
    return f"{PREFIX}login:{digest(login_id)}"


def caller_key(caller: str) -> str:
    return f"{PREFIX}caller:{digest(caller)}"


def flow_key(flow: str) -> str:
    return f"{PREFIX}flow:{digest(flow)}"


class Sealer:
    """AES-256-GCM over JSON records, with the first key sealing and every key opening."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("no key to seal with")
        self._ciphers = [AESGCM(k) for k in keys]

    def seal(self, name: str, record: Any) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[0].encrypt(nonce, orjson.dumps(record), name.encode())
        return VERSION + nonce + sealed

    def open(self, name: str, value: object) -> Any:
        """The record sealed under `name`; None when the value is not one of ours (a secret no
        longer listed, or written by someone else): such a record is as good as absent."""
        if not isinstance(value, bytes) or not value.startswith(VERSION):
            return None
        nonce, sealed = value[1 : 1 + NONCE_BYTES], value[1 + NONCE_BYTES :]
        for cipher in self._ciphers:
            try:
                plain = cipher.decrypt(nonce, sealed, name.encode())
            except (InvalidTag, ValueError):
                continue
            try:
                return orjson.loads(plain)
            except orjson.JSONDecodeError:
                return None
        return None


class RedisLogins:
    """`oauth.shared.SharedStore` in Redis."""

    def __init__(self, url: str, keys: Sequence[bytes], timeout: float) -> None:
        # No retries inside redis-py: each operation is one attempt within `timeout`; the
        # next one takes a fresh connection from the pool, which reconnects.
        self._client = connect(url, timeout)
        self._unlock = self._client.register_script(UNLOCK)
        self._sealer = Sealer(keys)
        self._breaker = Breaker(
            timeout,
            down="redis: the shared backend logins cannot be used (%s); per-user logins and"
            " token lookups fail until it answers",
            back="redis: answering again; the shared backend logins are back",
            logger=log,
        )

    async def _do(self, work: Awaitable[T]) -> T:
        # (No retry interval: every operation asks Redis, so `work` is always awaited.)
        try:
            return await self._breaker.call(lambda: work)
        except RedisDown as exc:
            raise StoreUnavailable(f"the cluster's Redis did not answer ({exc.reason})") from None

    async def _get(self, name: str) -> Any:
        return self._sealer.open(name, await self._do(self._client.get(name)))

    async def _set(
        self, name: str, record: Any, ttl: float | None = None, *, nx: bool = False
    ) -> bool:
        value = self._sealer.seal(name, record)
        px = _ms(ttl) if ttl is not None else None
        return bool(await self._do(self._client.set(name, value, px=px, nx=nx)))

    # --- tokens and registrations -----------------------------------------------------------

    async def load(self, key: Key) -> Record | None:
        return _record(await self._get(token_key(key)))

    async def save(self, key: Key, record: Record) -> None:
        # The same body the file store writes, so `auth list`-like tools read alike.
        await self._set(
            token_key(key),
            {**record, "resource": key.resource, "client": key.client, "user": key.user},
        )

    async def delete(self, key: Key) -> None:
        await self._do(self._client.delete(token_key(key)))

    async def lock(self, key: Key, ttl: float) -> str | None:
        held = secrets.token_hex(16)
        taken = await self._do(self._client.set(lock_key(key), held, px=_ms(ttl), nx=True))
        return held if taken else None

    async def unlock(self, key: Key, held: str) -> None:
        await self._do(self._unlock(keys=[lock_key(key)], args=[held]))

    async def load_registration(self, resource: str, client: str) -> Record | None:
        return _record(await self._get(registration_key(resource, client)))

    async def save_registration(self, resource: str, client: str, record: Record) -> bool:
        return await self._set(registration_key(resource, client), record, nx=True)

    async def forget(self, resource: str) -> int:
        gone = 0
        for kind in ("token", "registration"):
            pattern = f"{PREFIX}{kind}:{digest(resource)}:*"
            names = await self._do(_scan(self._client, pattern))
            if names:
                removed = int(await self._do(self._client.delete(*names)))
                gone += removed if kind == "token" else 0
        return gone

    # --- logins in progress -----------------------------------------------------------------

    async def open_login(
        self, caller: str, login_id: str, record: Record, ttl: float
    ) -> tuple[str, Record]:
        await self._set(login_key(login_id), record, ttl)
        if await self._set(caller_key(caller), login_id, ttl, nx=True):
            return login_id, record
        # Another login of this caller is open: that one holds (one link per caller), unless
        # it ended meanwhile.
        other = await self._get(caller_key(caller))
        found = _record(await self._get(login_key(other))) if isinstance(other, str) else None
        if isinstance(other, str) and found is not None:
            await self._do(self._client.delete(login_key(login_id)))
            return other, found
        await self._set(caller_key(caller), login_id, ttl)
        return login_id, record

    async def get_login(self, login_id: str) -> Record | None:
        return _record(await self._get(login_key(login_id)))

    async def put_login(self, login_id: str, record: Record) -> None:
        name = login_key(login_id)
        value = self._sealer.seal(name, record)
        await self._do(self._client.set(name, value, xx=True, keepttl=True))

    async def end_login(self, login_id: str, caller: str) -> None:
        await self._do(self._client.delete(login_key(login_id)))
        if await self._get(caller_key(caller)) == login_id:
            await self._do(self._client.delete(caller_key(caller)))

    async def put_flow(self, flow: str, record: Record, ttl: float) -> None:
        await self._set(flow_key(flow), record, ttl)

    async def take_flow(self, flow: str) -> Record | None:
        # GETDEL: one replica takes a state, and a replayed redirect finds nothing anywhere.
        name = flow_key(flow)
        return _record(self._sealer.open(name, await self._do(self._client.getdel(name))))

    async def drop_flow(self, flow: str) -> None:
        await self._do(self._client.delete(flow_key(flow)))

    async def close(self) -> None:
        await self._client.aclose()


async def _scan(client: Redis, pattern: str) -> list[Any]:
    return [name async for name in client.scan_iter(match=pattern, count=SCAN_COUNT)]


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _record(value: Any) -> Record | None:
    return value if isinstance(value, dict) else None

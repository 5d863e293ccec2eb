"""What the replicas of a cluster share of the OAuth client (`cluster.redis`), as the OAuth
client sees it: the stored logins (tokens, registrations) and the per-user logins in progress
(login links and their flows' one-time `state`s), so that a link made by one replica, opened at
another and called back at a third completes, and the token it gives serves every replica.

`gateway/cluster/logins.py` implements `SharedStore` over Redis, every value sealed (AES-GCM)
with keys derived from `cluster.secrets` for `PURPOSE`; `gateway/app/` wires it. Without
`cluster.redis` there is none: tokens are the file store's (`store.py`) and logins in progress
live in the desk's memory (`desk.MemoryLogins`, the same `LoginBook` contract).

Records are JSON-able dicts. A store that does not answer (or answers what it cannot have
written) raises `StoreUnavailable`, whose message names no key, token or URL.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.backend_auth.store import Key

# (Key is the store's, named here so the implementation needs this module alone.)
__all__ = ["PURPOSE", "Key", "LoginBook", "Record", "SharedStore", "StoreUnavailable"]

# What the keys sealing the shared records are derived with (config.ClusterConfig.keys): a key
# for these records signs or seals nothing else (cursors have a purpose of their own).
PURPOSE = b"mcp-gateway oauth store v1"

Record = dict[str, Any]


class StoreUnavailable(Exception):
    """The shared store cannot be used now (unreachable, too slow, or a record that does not
    open with any key): one line for the log and the caller's error, naming no secret."""


class LoginBook(Protocol):
    """The per-user logins in progress (`desk.LoginDesk`): a login by its id (the link's) and by
    its caller, and each flow by a digest of its `state`, every one expiring with its login."""

    async def open_login(
        self, caller: str, login_id: str, record: Record, ttl: float
    ) -> tuple[str, Record]:
        """The caller's open login (`caller`: a key naming backend and user), this one
        (`login_id`, `record`, good for `ttl` seconds) unless another is open already: the id
        and record of the one that holds."""
        ...

    async def get_login(self, login_id: str) -> Record | None: ...

    async def put_login(self, login_id: str, record: Record) -> None:
        """Change an open login's record, keeping its expiry (nothing if it has ended)."""
        ...

    async def end_login(self, login_id: str, caller: str) -> None:
        """The login is over (done, failed or expired): its id and its caller's entry (if it
        is still this login) are forgotten."""
        ...

    async def put_flow(self, flow: str, record: Record, ttl: float) -> None: ...

    async def take_flow(self, flow: str) -> Record | None:
        """The flow, taken: a second take of the same one finds nothing."""
        ...

    async def drop_flow(self, flow: str) -> None:
        """Forget a flow replaced by a newer one of its login (so none pile up)."""
        ...


class SharedStore(LoginBook, Protocol):
    """The cluster's store: `LoginBook`, and the records `store.TokenStore` keeps on disk."""

    async def load(self, key: Key) -> Record | None: ...

    async def save(self, key: Key, record: Record) -> None: ...

    async def delete(self, key: Key) -> None: ...

    async def lock(self, key: Key, ttl: float) -> str | None:
        """Take the renewal lock of `key`'s token for `ttl` seconds at most: a token to give
        back to `unlock`, or None when another replica holds it."""
        ...

    async def unlock(self, key: Key, held: str) -> None:
        """Give the lock back, if it is still the one taken (`held`)."""
        ...

    async def load_registration(self, resource: str, client: str) -> Record | None: ...

    async def save_registration(self, resource: str, client: str, record: Record) -> bool:
        """Keep a dynamic registration for every replica, unless one is kept already (False:
        the caller should use that one)."""
        ...

    async def forget(self, resource: str) -> int:
        """Delete every token record of a backend (by its URL); how many there were."""
        ...

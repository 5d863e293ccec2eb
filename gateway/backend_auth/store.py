"""Tokens and client registrations on disk: one JSON file per (backend URL, client, user) under
`$XDG_STATE_HOME/mcp-gateway` (default `~/.local/state/mcp-gateway`), each 0600 in a 0700
directory, written whole and renamed into place so a crash never leaves half a file."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("gateway.backend_auth")

SUFFIX = ".json"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or ""
    # XDG Base Directory: a relative path is invalid and is ignored.
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state"
    return root / "mcp-gateway"


@dataclass(frozen=True)
class Key:
    """Whose record: the backend's URL, the client (its id, or how it is obtained) and the user
    ("" for the gateway's own login)."""

    resource: str
    client: str
    user: str = ""

    def filename(self) -> str:
        digest = hashlib.sha256("\0".join((self.resource, self.client, self.user)).encode())
        return digest.hexdigest()[:40] + SUFFIX


class TokenStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self, key: Key) -> dict[str, Any] | None:
        path = self.directory / key.filename()
        try:
            record = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("token store: %s unreadable, ignored: %s", path, type(exc).__name__)
            return None
        return record if isinstance(record, dict) else None

    def save(self, key: Key, record: dict[str, Any]) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)  # (mkdir's mode does not apply to one already there)
        path = self.directory / key.filename()
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        body = {**record, "resource": key.resource, "client": key.client, "user": key.user}
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # (O_CREAT's mode does not apply to a file already there)
            os.write(fd, orjson.dumps(body, option=orjson.OPT_INDENT_2))
        finally:
            os.close(fd)
        os.replace(temp, path)

    def delete(self, key: Key) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / key.filename()).unlink()

    def records(self) -> list[tuple[Path, dict[str, Any]]]:
        if not self.directory.is_dir():
            return []
        out: list[tuple[Path, dict[str, Any]]] = []
        for path in sorted(self.directory.glob("*" + SUFFIX)):
            try:
                record = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(record, dict):
                out.append((path, record))
        return out

    def forget(self, backend: str) -> int:
        """Delete every record of a backend, named by its name or its URL; how many there were."""
        gone = 0
        for path, record in self.records():
            if backend in (record.get("backend"), record.get("resource")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    gone += 1
        return gone

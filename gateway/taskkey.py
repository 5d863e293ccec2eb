"""The key that signs task ids when no cluster secret does (`tasks.key_file`).

A task outlives the request that created it, and a client may poll it after the gateway
restarted: the key must outlive the process. It is made once (32 random bytes, hex, in a file
only its owner may read) and read at every start. Without a usable file the key is the process's
own, said once in the log: tasks then end for their clients with the process.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from pathlib import Path

log = logging.getLogger("gateway")

KEY_BYTES = 32
FILE_NAME = "task-key"


def default_path() -> Path:
    """$XDG_STATE_HOME/mcp-gateway/task-key (XDG Base Directory: state that survives restarts,
    not worth backing up), ~/.local/state when the variable is unset or not absolute."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "mcp-gateway" / FILE_NAME


def load(path: str | None) -> bytes:
    """The key in `path` (None: the default path), made there first if the file is absent."""
    where = Path(path) if path is not None else default_path()
    try:
        return _read_or_make(where)
    except (OSError, ValueError) as exc:
        log.warning(
            "task key %s unusable (%s): task ids are signed with this process's own key and "
            "end with it",
            where,
            exc,
        )
        return os.urandom(KEY_BYTES)


def _read_or_make(where: Path) -> bytes:
    try:
        return _read(where)
    except FileNotFoundError:
        pass
    where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Written whole under another name, then linked into place (link fails if the name exists):
    # of two gateways starting at once, one makes it and the other reads it, never half written.
    fd, temporary = tempfile.mkstemp(dir=where.parent, prefix=f".{FILE_NAME}.")
    try:
        with os.fdopen(fd, "w") as file:  # (mkstemp makes it owner-only: 0600)
            file.write(secrets.token_hex(KEY_BYTES) + "\n")
        try:
            os.link(temporary, where)
            log.info("task key made: %s", where)
        except FileExistsError:
            pass
    finally:
        os.unlink(temporary)
    return _read(where)


def _read(where: Path) -> bytes:
    if where.stat().st_mode & 0o077:
        log.warning("task key %s is readable by others than its owner (chmod 600 it)", where)
    text = where.read_text().strip()
    key = bytes.fromhex(text)  # ValueError: not what this module writes
    if len(key) < 16:
        raise ValueError("shorter than 16 bytes")
    return key

"""`cluster:`: the secrets identical replicas share, from the config (usually `${VAR}`) or from
a file. Never a default: a secret everybody can read in this repository signs nothing. No
secret reaches a problem's text: problems name the place (the list index, the file's line),
never the value, so `check-config` can be pasted into a ticket."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config import keys
from gateway.config.model import MIN_CLUSTER_SECRET_LENGTH, ClusterConfig
from gateway.config.reader import _Check

_SOURCES = ("secrets", "secrets_file")
_HOW = "openssl rand -base64 32 makes one"


def cluster(c: _Check, raw: Any, beside: Callable[[str], Path]) -> ClusterConfig | None:
    if raw is None:
        return None
    path = ("cluster",)
    body = c.mapping(raw, path, keys.names("cluster"))
    if not isinstance(raw, dict):
        return None  # c.mapping has said why
    given = [k for k in _SOURCES if body.get(k) is not None]
    if len(given) != 1:
        c.r.problem(path, "needs exactly one of secrets or secrets_file")
        return None
    if given[0] == "secrets":
        return _listed(c, body["secrets"], path + ("secrets",))
    return _from_file(c, body, path, beside)


def _listed(c: _Check, raw: Any, path: tuple[str, ...]) -> ClusterConfig | None:
    secrets = c.strings(raw, path)
    if not secrets:
        if raw == []:  # else c.strings has said why
            c.r.problem(path, f"name at least one secret ({_HOW})")
        return None
    for i, secret in enumerate(secrets):
        if len(secret) < MIN_CLUSTER_SECRET_LENGTH:
            c.r.problem(path + (str(i),), _too_short(secret))
    return ClusterConfig(secrets=secrets)


def _from_file(
    c: _Check, body: dict[str, Any], path: tuple[str, ...], beside: Callable[[str], Path]
) -> ClusterConfig | None:
    where_key = path + ("secrets_file",)
    name = c.field(body, path, "secrets_file", keys.table("cluster")["secrets_file"])
    if not name:
        if name is not None:
            c.r.problem(where_key, "must name a file")
        return None
    file = beside(name)
    try:
        text = file.read_text(encoding="utf-8")
        mode = file.stat().st_mode
    except OSError as exc:
        c.r.problem(where_key, f"cannot read {file}: {exc.strerror}")
        return None
    except UnicodeDecodeError:
        c.r.problem(where_key, f"{file} is not a UTF-8 text file")
        return None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        # Whoever can write the file can add a secret of their own, which every replica then
        # accepts. (Reading is left to the operator: mounted secrets are often 0644 in a
        # container nobody else runs in.)
        c.r.problem(where_key, f"{file} is writable by others than its owner (chmod go-w)")
    secrets: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        secret = line.strip()
        if not secret or secret.startswith("#"):
            continue  # blank lines and comments, so the file can say which secret is which
        if len(secret) < MIN_CLUSTER_SECRET_LENGTH:
            c.r.problem(where_key, f"line {number} of {file} {_too_short(secret)}")
        secrets.append(secret)
    if not secrets:
        c.r.problem(where_key, f"{file} holds no secret (one per line; {_HOW})")
        return None
    return ClusterConfig(secrets=tuple(secrets), secrets_file=str(file))


def _too_short(secret: str) -> str:
    if not secret:
        return "is empty"
    return (
        f"is shorter than {MIN_CLUSTER_SECRET_LENGTH} characters: a short secret can be "
        f"guessed from one signed cursor ({_HOW})"
    )

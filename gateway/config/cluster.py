"""`cluster:`: the secrets identical replicas share, from the config (usually `${VAR}`) or from
a file. Never a default: a secret everybody can read in this repository signs nothing. No
secret reaches a problem's text: problems name the place (the list index, the file's line),
never the value, so `check-config` can be pasted into a ticket."""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.config import keys
from gateway.config.credentials import MIN_CLUSTER_SECRET_LENGTH, REDIS_SCHEMES, ClusterConfig
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
    shared = _redis(c, body, path)
    if len(given) != 1:
        c.r.problem(path, "needs exactly one of secrets or secrets_file")
        return None
    if given[0] == "secrets":
        found = _listed(c, body["secrets"], path + ("secrets",))
    else:
        found = _from_file(c, body, path, beside)
    return None if found is None else replace(found, **shared)


def _redis(c: _Check, body: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    table = keys.table("cluster")
    url = c.field(body, path, "redis", table["redis"])
    if url is not None:
        where = path + ("redis",)
        # Problems name the key, never the URL: it may carry Redis's password.
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (a port that is not a number raises here)
        except ValueError:
            c.r.problem(where, "is not a URL (redis://HOST:PORT/DB)")
        else:
            if parts.scheme not in REDIS_SCHEMES or not parts.hostname:
                c.r.problem(where, "must be a redis:// or rediss:// URL naming a host")
            elif parts.path.strip("/") and not parts.path.strip("/").isdigit():
                c.r.problem(where, "names its database by number (redis://HOST:PORT/0)")

    # The secrets are read by the caller: exactly one of two keys.
    return {"redis": url, **c.scalars(body, path, ClusterConfig, skip={"redis", *_SOURCES})}


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

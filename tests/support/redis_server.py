"""A real `redis-server` (Debian's, `make ci-deps`) for the tests, on a free loopback port,
keeping nothing on disk; stopped (and restarted, or paused) by the tests that need Redis to
fail."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from tests.support import Proc, missing
from tests.support.backend import free_port

REDIS_SERVER = "/usr/bin/redis-server"
NO_DISK = ("--save", "", "--appendonly", "no")

__all__ = [
    "REDIS_SERVER",
    "free_port",
    "launch",
    "need_redis",
    "redis_port",
    "redis_server",
    "redis_url",
]


def launch(port: int, password: str | None = None) -> Proc:
    """A Redis of the test's own on 127.0.0.1:`port`, once it is ready (it says so)."""
    auth = ("--requirepass", password) if password else ()
    proc = Proc([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", *NO_DISK, *auth])
    try:
        proc.wait_for("Ready to accept connections", stream="stdout")
    except BaseException:
        proc.stop()
        raise
    return proc


def need_redis() -> None:
    if not Path(REDIS_SERVER).exists():
        missing("redis-server", "make ci-deps installs Debian's redis-server")


@contextmanager
def redis_server(port: int, password: str | None = None) -> Iterator[Proc]:
    need_redis()
    proc = launch(port, password)
    try:
        yield proc
    finally:
        proc.stop()


def redis_url(port: int, password: str | None = None, db: int = 0) -> str:
    userinfo = f":{password}@" if password else ""
    return f"redis://{userinfo}127.0.0.1:{port}/{db}"


@pytest.fixture
async def redis_port() -> AsyncIterator[int]:
    """The port of a Redis of the test's own, stopped after it (skips outside CI without one)."""
    need_redis()
    port = free_port()
    proc: Proc = await anyio.to_thread.run_sync(launch, port)
    try:
        yield port
    finally:
        proc.stop()

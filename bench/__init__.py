"""Benchmark suite for the gateway: echo backend, load generator, baselines and proxies."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

try:
    import uvloop
except ImportError:  # the bench runs without it, only slower
    uvloop = None  # type: ignore[assignment]

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on uvloop when it is installed, as the gateway itself does."""
    if uvloop is None:
        return asyncio.run(main)
    return uvloop.run(main)

"""The cluster tests' shared fixtures: a Redis of the test's own (`redis_port`)."""

from tests.support.redis_server import redis_port

__all__ = ["redis_port"]

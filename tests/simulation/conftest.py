"""The real server fixtures, for checking the emulation against Valkey."""

from tests.integration.conftest import redis_binary, redis_prefix, redis_server

__all__ = ["redis_binary", "redis_prefix", "redis_server"]

"""Redis connections: one place that knows URLs, timeouts and the arq pool settings."""

from __future__ import annotations

from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vllm_srun.queue import protocol

# What a lost or unreachable Redis raises, wherever it is called.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)

# Short timeouts: a Redis that is gone must turn into a fast 503, never a hang.
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 5.0


def make_pool(url: str) -> ArqRedis:
    """An arq-capable client on `url` (redis://, rediss:// or unix://)."""
    pool = ConnectionPool.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=30,
        max_connections=512,
    )
    return ArqRedis(
        connection_pool=pool,
        job_serializer=protocol.serialize,
        job_deserializer=protocol.deserialize,
    )


def pubsub_client(url: str) -> ArqRedis:
    """A client for subscriptions: no socket timeout, since a subscriber waits on purpose."""
    pool = ConnectionPool.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, health_check_interval=30)
    return ArqRedis(connection_pool=pool)


def describe_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    settings = RedisSettings.from_dsn(url) if url.startswith(("redis://", "rediss://")) else None
    if settings is None:
        return url
    return f"{url.split('://', 1)[0]}://{settings.host}:{settings.port}/{settings.database}"

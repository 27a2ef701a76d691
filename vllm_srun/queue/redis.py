"""Redis connections: one place that knows URLs, timeouts and the arq pool settings.

Two roles (DESIGN.md, "Two Redis roles"): the main Redis holds queues, leases, job state and
job results and must never evict; the result cache (`--cache-redis`, by default the main one)
may. `EvictionPolicy` is what a start reads of the main Redis to say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vllm_srun.errors import Unavailable
from vllm_srun.queue import protocol

# What a lost or unreachable Redis raises, wherever it is called.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


def out_of_memory(exc: BaseException) -> bool:
    """Redis at maxmemory under noeviction refused a write: OutOfMemoryError (in a transaction
    too, where redis-py's message no longer starts with OOM), or inside a script a plain
    ResponseError ("Error running script ... -OOM command not allowed ...")."""
    return isinstance(exc, OutOfMemoryError) or (
        isinstance(exc, ResponseError) and "OOM command not allowed" in str(exc)
    )


def state_full() -> Unavailable:
    """What a refused write is answered: 503 with Retry-After; nothing was written, nothing lost.
    Redis's own message is not passed on: in a pipeline it quotes the refused command (a job's
    requests, megabytes)."""
    return Unavailable(
        "the state Redis is full (maxmemory under noeviction): retry later", headers={"Retry-After": "5"}
    )


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


def blocking_pool(url: str, max_connections: int) -> ArqRedis:
    """A client on a pool of at most `max_connections` that waits for a free connection instead
    of failing ("Too many connections"): for long reads (event streams) that must not take the
    request path's pool, however many wait."""
    pool = BlockingConnectionPool.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=30,
        max_connections=max_connections,
        timeout=None,  # a waiting stream is bounded by the stream caps, not by this pool
    )
    return ArqRedis(connection_pool=pool)


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


# What `maxmemory-policy` reads as where CONFIG is renamed or disabled (managed Redis services).
UNKNOWN_POLICY = "unknown"


@dataclass(frozen=True)
class EvictionPolicy:
    """The main Redis's `maxmemory-policy`: anything but `noeviction` may drop queue entries,
    leases and job state under memory pressure, not only cached results."""

    maxmemory_policy: str

    @property
    def evicting(self) -> bool:
        return self.maxmemory_policy not in ("noeviction", UNKNOWN_POLICY)

    @property
    def warning(self) -> str | None:
        if not self.evicting:
            return None
        return (
            f"the main Redis evicts keys (maxmemory-policy {self.maxmemory_policy}): under memory "
            "pressure it may drop queued work, leases and job state; set it to noeviction and put "
            "the result cache on its own Redis with --cache-redis"
        )

    def describe(self) -> dict[str, Any]:
        """What /health reports."""
        return {"maxmemory_policy": self.maxmemory_policy, "evicting": self.evicting, "warning": self.warning}


def policy_of(reply: Any) -> EvictionPolicy:
    """The policy from a CONFIG GET maxmemory-policy reply (a dict, or a flat list)."""
    if isinstance(reply, list | tuple):
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    value = dict(reply or {}).get("maxmemory-policy", dict(reply or {}).get(b"maxmemory-policy"))
    if value is None:
        return EvictionPolicy(UNKNOWN_POLICY)
    return EvictionPolicy(value.decode() if isinstance(value, bytes) else str(value))


async def eviction_policy(redis: ArqRedis) -> EvictionPolicy:
    """The main Redis's policy; `unknown` where CONFIG is refused (renamed, or an ACL)."""
    try:
        return policy_of(await redis.config_get("maxmemory-policy"))
    except ResponseError:
        return EvictionPolicy(UNKNOWN_POLICY)

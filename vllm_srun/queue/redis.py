"""Redis connections: one place that knows URLs, timeouts and the arq pool settings.

The main Redis holds queues, leases, job state and job results and must never evict; the
result cache (`--cache-redis`, by default the main one) may (`EvictionPolicy`). A URL naming
a Redis Cluster node gets redis-py's cluster client; what differs there (no MULTI, scripts
sent whole in a pipeline, one MGET per master, subscriptions node by node) is handled here.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis as sync_redis
from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio import connection as redis_connection
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import parse_url
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vllm_srun.errors import Unavailable
from vllm_srun.queue import protocol, scripts
from vllm_srun.queue.links import RedisTimeouts

# What a lost or unreachable Redis raises, wherever it is called (on a cluster also while a
# failover is under way: its slots are down, or being moved).
REDIS_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
    OSError,
    ClusterDownError,
    TryAgainError,
)


def lost_connection(exc: BaseException) -> bool:
    """Whether `exc` is Redis lost under a command: one of REDIS_ERRORS; the RuntimeError uvloop
    raises when redis-py writes to a transport that closed under it ("the handler is closed");
    or the AttributeError redis-py raises inside its connection module when its cluster client
    closed every connection of a failed node, those in use by other tasks too (their stream is
    None mid-command). Both are passed on as they are; both were seen when a cluster's master
    was killed mid-job, and each, taken for a bug, finished a chunk as failed and left its
    lines unstored."""
    if isinstance(exc, REDIS_ERRORS):
        return True
    if isinstance(exc, RuntimeError):
        return "handler is closed" in str(exc)
    return (
        isinstance(exc, AttributeError) and "'NoneType'" in str(exc) and _raised_in(exc, _CONNECTION_MODULE)
    )


@contextlib.contextmanager
def unavailable_when_lost() -> Iterator[None]:
    """Redis lost under a command (`lost_connection`) becomes Unavailable (503, Retry-After);
    anything else passes as it is."""
    try:
        yield
    except Exception as exc:
        if lost_connection(exc):
            raise Unavailable(f"Redis is unreachable: {exc}", headers={"Retry-After": "1"}) from exc
        raise


# redis-py's asyncio connection module, where a stream closed under a command is met.
_CONNECTION_MODULE = Path(redis_connection.__file__).resolve()


def _raised_in(exc: BaseException, module: Path) -> bool:
    """Whether the innermost frame of `exc`'s traceback is in `module`."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve() == module


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


# A cluster's node addresses (host, port), per URL given: known once per process.
_CLUSTERS: dict[str, list[tuple[str, int]]] = {}
_SINGLE: set[str] = set()
_DETECT = threading.Lock()


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The nodes of the cluster `url` names, the named one first; [] for a single Redis (or one
    that cannot be reached now: the start-up check, `check_cluster`, reports that)."""
    if url.startswith("unix://"):
        return []
    with _DETECT:
        if url in _CLUSTERS:
            return _CLUSTERS[url]
        if url in _SINGLE:
            return []
        try:
            timeouts = RedisTimeouts.from_env()
            client = sync_redis.Redis.from_url(
                url, socket_connect_timeout=timeouts.connect_s, socket_timeout=timeouts.socket_s
            )
            with client:
                if not int(cast(dict[str, Any], client.info("cluster")).get("cluster_enabled", 0)):
                    _SINGLE.add(url)
                    return []
                nodes = _node_addresses(client.execute_command("CLUSTER NODES"))  # type: ignore[no-untyped-call]
        except (sync_redis.RedisError, OSError):
            return []
        settings = RedisSettings.from_dsn(url)
        first = (str(settings.host), settings.port)
        _CLUSTERS[url] = [first, *(n for n in nodes if n != first)]
        return _CLUSTERS[url]


def _node_addresses(reply: object) -> list[tuple[str, int]]:
    """(host, port) of each node of a CLUSTER NODES reply (a text, or redis-py's parsed dict)."""
    if isinstance(reply, dict):
        names = list(reply)
    else:
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        names = [line.split()[1] for line in text.splitlines() if line.strip()]
    out = []
    for name in names:
        address = (name.decode() if isinstance(name, bytes) else str(name)).split("@", 1)[0]
        host, _, port = address.rpartition(":")
        if host and port.isdigit():
            out.append((host, int(port)))
    return out


def is_cluster(client: object) -> bool:
    """Whether `client` (a client or a pipeline) talks to a Redis Cluster."""
    return isinstance(client, RedisCluster | ClusterPipeline)


def _cluster(url: str, max_connections: int) -> ArqRedis:
    # The commands this package sends are common to both clients; arq's own transactions are
    # replaced where they would run on it (worker.arq_worker.DrivenWorker).
    client = RedisCluster.from_url(
        url,
        **RedisTimeouts.from_env().options(url),
        max_connections=max_connections,
        # A failover takes the cluster-node-timeout and an election: retried within that, a
        # command that met it is answered late, not failed.
        cluster_error_retry_attempts=8,
    )
    return cast(ArqRedis, client)


def make_pool(url: str) -> ArqRedis:
    """An arq-capable client on `url` (redis://, rediss:// or unix://); on a cluster's node, a
    cluster client of the same commands."""
    if cluster_nodes(url):
        return _cluster(url, 512)
    pool = ConnectionPool.from_url(
        url,
        **RedisTimeouts.from_env().options(url),
        max_connections=512,
    )
    return ArqRedis(
        connection_pool=pool,
        job_serializer=protocol.serialize,
        job_deserializer=protocol.deserialize,
    )


# The longest a blocking read on a `blocking_pool` (an event stream's XREAD) waits on the server.
BLOCKING_READ_S = 2.0


def blocking_pool(url: str, max_connections: int) -> ArqRedis:
    """A client on a pool of at most `max_connections` that waits for a free connection instead
    of failing ("Too many connections"): for long reads (event streams) that must not take the
    request path's pool, however many wait. On a cluster, a cluster client of at most
    `max_connections` per node."""
    if cluster_nodes(url):
        return _cluster(url, max_connections)
    options = RedisTimeouts.from_env().options(url)
    # A blocking read waits on the server first: its reply is due that much later.
    options["socket_timeout"] += BLOCKING_READ_S
    pool = BlockingConnectionPool.from_url(
        url,
        **options,
        max_connections=max_connections,
        timeout=None,  # a waiting stream is bounded by the stream caps, not by this pool
    )
    return ArqRedis(connection_pool=pool)


def pubsub_client(url: str) -> Subscriber:
    """A client for subscriptions: no read timeout, since a subscriber waits on purpose (a
    `Listening` bounds its silence instead). Each `pubsub()` of it is a new subscription; on a
    cluster each is to the next node in turn, so a subscriber that lost its node subscribes
    again on another."""
    return Subscriber(url, cluster_nodes(url))


class Subscriber:
    """Subscriptions to one Redis, or to the nodes of a cluster in turn (see `pubsub_client`)."""

    def __init__(self, url: str, nodes: Sequence[tuple[str, int]] = ()) -> None:
        self.timeouts = RedisTimeouts.from_env()
        # redis-py's own health check is off here: it swallows its PONGs, which `Listening`
        # counts as signs of life (it PINGs a quiet subscription itself).
        options = {**self.timeouts.options(url), "health_check_interval": 0}
        self._clients: list[Redis] = []
        if nodes:
            given = parse_url(url)  # redis-py's own reading: credentials unquoted, TLS, database
            self._clients = [
                Redis(connection_pool=ConnectionPool(**{**given, "host": h, "port": p, **options}))
                for h, p in nodes
            ]
        else:
            self._clients = [ArqRedis(connection_pool=ConnectionPool.from_url(url, **options))]
        self._turn = itertools.cycle(self._clients)

    def pubsub(self) -> PubSub:
        return next(self._turn).pubsub()

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


async def run_script(client: Any, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run Lua `script` on `client` (a client or a pipeline). On a client or a single Redis's
    pipeline, by its digest (loaded when missing); on a cluster's pipeline, whole (EVAL): such a
    pipeline cannot load a script a node lacks, which a promoted replica may."""
    if isinstance(client, ClusterPipeline):
        return client.eval(script, len(keys), *keys, *args)
    return await client.register_script(script)(keys=list(keys), args=list(args), client=client)


_PUBLISH = scripts.load("publish_after")


def publish(pipe: Any, channel: str, message: bytes, *, after: str) -> None:
    """Queue a PUBLISH on `pipe` that runs after the pipeline's commands on key `after`'s slot.
    A cluster pipeline refuses PUBLISH, and would send it to some node at the same time as the
    writes it announces; a script declaring `after` runs on that slot's master, in order."""
    if isinstance(pipe, ClusterPipeline):
        cast(Any, pipe).eval(_PUBLISH, 1, after, channel, message)
    else:
        pipe.publish(channel, message)


# How long a write waits for a replica's acknowledgement (`wait_replica`) before it goes on.
REPLICA_WAIT_MS = 500


def wait_replica(pipe: Any, client: Any, key: str) -> None:
    """On a cluster pipeline (of `client`), queue a WAIT, on `key`'s master after the writes the
    pipeline sends there, for one replica to have them (at most REPLICA_WAIT_MS). Replication is
    asynchronous: a master killed before its replica had a write loses it in the failover, and
    what other masters hold that depends on it (a chunk acknowledged on the model's slot, a
    job's records) would be left without it. WAIT counts the writes of its own connection, so
    it travels in the same pipeline. Nothing on a single Redis, or for a master without a
    replica now (its own was promoted)."""
    if not isinstance(pipe, ClusterPipeline):
        return
    nodes = client.nodes_manager.slots_cache.get(client.keyslot(key)) or []
    if len(nodes) >= 2:
        pipe.execute_command("WAIT", 1, REPLICA_WAIT_MS, target_nodes=nodes[0])


def pipeline(client: Any, *, transaction: bool) -> Any:
    """`client.pipeline(transaction=...)`; on a cluster always without MULTI (see the module doc):
    what one of ours touches shares a slot, so its commands reach one master in order."""
    return client.pipeline(transaction=transaction and not is_cluster(client))


async def mget(client: Any, keys: Sequence[str]) -> list[Any]:
    """MGET of `keys`; on a cluster, one MGET per master, in parallel (the keys spread)."""
    if not keys:
        return []
    if is_cluster(client):
        return list(await client.mget_nonatomic(list(keys)))
    return list(await client.mget(list(keys)))


def check_cluster(url: str, *, flag: str = "--redis") -> None:
    """At start: a cluster that `url` names must serve every slot and answer CLUSTER commands,
    or the start is refused naming it (instead of requests that hang on a slot nobody serves).
    Nothing to check of a single Redis."""
    from vllm_srun.errors import ConfigError

    if url.startswith("unix://"):
        return
    where = describe_url(url)
    client = sync_redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3, decode_responses=True)
    with client:
        try:
            enabled = int(cast(dict[str, Any], client.info("cluster")).get("cluster_enabled", 0))
        except sync_redis.ResponseError:
            return  # INFO refused: not a cluster this package can tell; a single Redis as before
        if not enabled:
            return
        try:
            info = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
        except sync_redis.ResponseError as exc:
            raise ConfigError(
                f"{flag} {where} is a Redis Cluster node that refuses CLUSTER commands ({exc}): "
                "allow CLUSTER INFO, CLUSTER NODES and CLUSTER SLOTS for this user"
            ) from exc
    fields = _cluster_info(info)
    assigned = int(fields.get("cluster_slots_assigned", "0"))
    if assigned < 16384 or fields.get("cluster_state") != "ok":
        raise ConfigError(
            f"{flag} {where}: the Redis Cluster is not ready (cluster_state "
            f"{fields.get('cluster_state', '?')}, {assigned} of 16384 slots assigned, "
            f"{fields.get('cluster_slots_fail', '?')} failing): assign every slot to a master "
            "(redis-cli --cluster create / fix) and start again"
        )


def _cluster_info(reply: object) -> dict[str, str]:
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


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
    """The main Redis's policy; `unknown` where CONFIG is refused (renamed, or an ACL). On a
    cluster, the policy of the node redis-py asks (operators set it alike on every node)."""
    try:
        return policy_of(await redis.config_get("maxmemory-policy"))
    except ResponseError:
        return EvictionPolicy(UNKNOWN_POLICY)

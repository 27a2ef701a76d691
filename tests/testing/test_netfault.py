"""The fault-injecting proxy, between redis-py and a real Redis."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from helpers import RedisProcess

from vllm_srun.testing.netfault import ThreadedProxy


@pytest.fixture
def proxy(redis_proc: RedisProcess) -> Iterator[ThreadedProxy]:
    proxy = ThreadedProxy(("127.0.0.1", redis_proc.port))
    yield proxy
    proxy.close()


def client(proxy: ThreadedProxy, timeout_s: float = 2.0) -> redis.Redis:
    return redis.Redis.from_url(proxy.url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def test_it_forwards_commands_both_ways(proxy: ThreadedProxy) -> None:
    with client(proxy) as r:
        r.set("k", b"x" * 200_000)  # larger than one read: chunks arrive whole and in order
        assert r.get("k") == b"x" * 200_000
        assert proxy.proxy.connections_made == 1


def test_latency_delays_each_round_trip(proxy: ThreadedProxy) -> None:
    with client(proxy) as r:
        r.ping()
        proxy.delay(0.2, 0.05)
        started = time.monotonic()
        for _ in range(3):
            assert r.ping()
        took = time.monotonic() - started
        # Each round trip is delayed twice (there and back), 0.15 to 0.25 s each way.
        assert 3 * 2 * 0.15 <= took < 3 * 2 * 0.25 + 1.0, took
        proxy.heal()
        started = time.monotonic()
        r.ping()
        assert time.monotonic() - started < 0.5  # no delay left: a round trip on this host


def test_reset_breaks_open_connections_and_not_later_ones(proxy: ThreadedProxy) -> None:
    with client(proxy) as r:
        pubsub = r.pubsub()
        pubsub.subscribe("ch")
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"
        assert proxy.reset() == 1
        with pytest.raises(redis.ConnectionError):
            pubsub.get_message(timeout=2)
        pubsub.close()
        assert r.ping()  # a new connection passes


def test_blackhole_is_silence_until_healed(proxy: ThreadedProxy) -> None:
    with client(proxy, timeout_s=0.5) as r:
        r.set("k", "before")
        proxy.blackhole()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            r.set("k", "dropped")
        assert 0.4 < time.monotonic() - started < 1.5  # no FIN, no RST: only the timeout tells
        with pytest.raises(redis.TimeoutError):
            r.get("k")  # a new connection is accepted, and as silent
        proxy.heal()
        assert r.get("k") == b"before", "what arrived during the blackhole was dropped"

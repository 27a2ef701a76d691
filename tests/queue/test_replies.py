"""Redis links that go silent: the timeouts' settings, a subscription's silence, and an app's
queue client on a blackholed link (503 at the deadline, refused at once, healed), in process
against a real Redis behind the fault proxy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
from helpers import RedisProcess
from redis.asyncio import Redis

from vllm_srun.errors import ConfigError, Unavailable
from vllm_srun.plugins.base import LoadedModel, WorkItem
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys
from vllm_srun.queue.client import QueueClient
from vllm_srun.queue.links import Listening, RedisTimeouts, SilentLink
from vllm_srun.queue.redis import pubsub_client
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker
from vllm_srun.testing.netfault import ThreadedProxy


def test_timeouts_have_defaults_and_read_the_environment() -> None:
    assert RedisTimeouts.from_env({}) == RedisTimeouts()
    got = RedisTimeouts.from_env({"VLLM_SRUN_REDIS_SOCKET_S": "1.5", "VLLM_SRUN_REDIS_SILENCE_S": "3"})
    assert (got.socket_s, got.silence_s, got.connect_s) == (1.5, 3.0, RedisTimeouts().connect_s)
    options = got.options("redis://h:1/0")
    assert options["socket_timeout"] == 1.5 and options["socket_keepalive"] is True
    assert "socket_keepalive" not in got.options("unix:///tmp/r.sock")  # no TCP there
    for bad in ("0", "-1", "soon", "inf"):
        with pytest.raises(ConfigError, match="VLLM_SRUN_REDIS_CONNECT_S"):
            RedisTimeouts.from_env({"VLLM_SRUN_REDIS_CONNECT_S": bad})


@pytest.fixture
def proxy(redis_proc: RedisProcess) -> Iterator[ThreadedProxy]:
    # On a loop of its own: the clients' start-up checks are synchronous calls through it.
    proxy = ThreadedProxy(("127.0.0.1", redis_proc.port))
    yield proxy
    proxy.close()


async def test_a_quiet_subscription_lives_and_a_silent_one_is_dropped(
    proxy: ThreadedProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SRUN_REDIS_SILENCE_S", "1")
    subscriber = pubsub_client(proxy.url)
    pubsub = subscriber.pubsub()
    try:
        await pubsub.subscribe("quiet")
        listening = Listening(pubsub, subscriber.timeouts)
        started = time.monotonic()
        while time.monotonic() - started < 2.5:  # nothing published: its PINGs keep it alive
            message = await listening.next(0.2)
            assert message is None or message["type"] == "subscribe"
        proxy.blackhole()
        silent = time.monotonic()
        with pytest.raises(SilentLink):
            while True:
                await listening.next(0.2)
        assert time.monotonic() - silent < 1.0 + 0.5
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await subscriber.aclose()


async def test_a_blackholed_app_link_is_503_at_the_deadline_and_heals(
    proxy: ThreadedProxy,
    redis_proc: RedisProcess,
    deployment: Deployment,
    stats: Stats,
    keywords_model: LoadedModel,
    classify_items: Callable[..., list[WorkItem]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_SRUN_REDIS_SILENCE_S", "1.5")
    monkeypatch.setenv("VLLM_SRUN_REDIS_SOCKET_S", "1")
    client = QueueClient(proxy.url, result_ttl_s=60)
    await client.start()
    model = keywords_model.info
    # A worker that heartbeats but takes nothing yet: the first request waits for its reply.
    direct = Redis.from_url(redis_proc.url)
    await direct.zadd(keys.worker_key(model.name), {"ghost": int(time.time() * 1000) + 60_000})
    worker = None

    async def submit(text: str, timeout_s: float) -> object:
        got = await client.submit(
            model.name, model.model_sha256, classify_items(text), numerics=model.numerics, timeout_s=timeout_s
        )
        return got.results[0]

    try:
        asked = time.monotonic()
        waiting = asyncio.ensure_future(submit("refund", 2.0))
        await asyncio.sleep(0.3)
        proxy.blackhole()
        blackholed = time.monotonic()
        with pytest.raises(Unavailable):
            await waiting
        assert 2.0 <= time.monotonic() - asked < 3.0, "a 503 at the request's deadline, not a hang"
        # Known down within the silence bound (its PING unanswered), with why.
        while client.link_down is None:
            assert time.monotonic() - blackholed < 1.5 + 1.0, "the silent link was noticed"
            await asyncio.sleep(0.05)
        assert "is down" in client.link_down
        refused = time.monotonic()
        with pytest.raises(Unavailable, match="is down"):
            await submit("invoice", 5.0)
        assert time.monotonic() - refused < 0.5, "a new request is refused at once"
        await direct.delete(keys.worker_key(model.name))
        # The worker's own link stays up: only the app's goes through the proxy.
        worker = DeviceWorker(
            redis_url=redis_proc.url, deployments=[deployment], stats=stats, poll_delay_s=5.0
        )
        await worker.start()
        proxy.heal()
        healed = time.monotonic()
        while client.link_down is not None:
            assert time.monotonic() - healed < 3.0, "the link comes back within seconds"
            await asyncio.sleep(0.05)
        assert not isinstance(await submit("invoice", 5.0), Exception)
        assert not isinstance(await submit("refund", 5.0), Exception)
    finally:
        await client.close()
        await direct.aclose()
        if worker is not None:
            await worker.close()

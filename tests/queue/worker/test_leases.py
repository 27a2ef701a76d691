"""Leases and crash recovery (vllm_srun/queue/worker/leases.py) in process, on a real Redis.

A "dead" worker is an arq worker that claimed a job and whose leases nobody renews: what a
`kill -9` leaves behind. The reaper of another process's LeaseKeeper must put that job back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import arq.constants
import numpy as np
import pytest
from arq.connections import ArqRedis
from arq.worker import func

from vllm_srun.plugins.base import ItemError, LoadedModel, WorkItem
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.arq_compat import add_job
from vllm_srun.queue.redis import pubsub_client
from vllm_srun.queue.results import decode_result
from vllm_srun.queue.worker.arq_worker import DrivenWorker
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker
from vllm_srun.queue.worker.leases import LeaseKeeper

QUEUE = "test:leases"
WAKE = "test:leases:wake"
LEASE_S = 0.3


def arq_worker(
    redis: ArqRedis,
    function: Callable[..., Awaitable[Any]],
    *,
    queue: str = QUEUE,
    lease_s: float = LEASE_S,
) -> DrivenWorker:
    return DrivenWorker(
        functions=[func(function, name=keys.RUN_ITEMS)],
        queue_name=queue,
        redis_pool=redis,
        handle_signals=False,
        keep_result=0,
        job_serializer=protocol.serialize,
        job_deserializer=protocol.deserialize,
        lease_s=lease_s,
        wake_channel=WAKE if queue == QUEUE else keys.wake_channel(queue.rsplit(":", 1)[-1]),
    )


async def enqueue(redis: ArqRedis, payload: bytes, *, queue: str = QUEUE) -> str:
    async with redis.pipeline(transaction=True) as pipe:
        job_id = add_job(pipe, queue=queue, function=keys.RUN_ITEMS, payload=payload, expires_s=60)
        await pipe.execute()
    return job_id


async def until_lapsed(redis: ArqRedis, queue: str, job_id: str) -> None:
    """Until the expiry the claim gave the job's lease (its score, in ms) has passed: a beat
    from now on finds it lapsed (the reaper compares it with the same clock)."""
    expiry_ms = await redis.zscore(keys.lease_key(queue), job_id)
    assert expiry_ms is not None, "the job is leased"
    while (now_ms := time.time() * 1000) <= expiry_ms:
        await asyncio.sleep((expiry_ms - now_ms) / 1000 + 0.001)


async def hang(ctx: dict[str, Any], payload: bytes) -> None:
    await asyncio.Event().wait()  # a worker that never finishes: killed mid-job


@pytest.fixture
async def wakes(redis_url: str) -> AsyncIterator[Callable[[], Awaitable[list[bytes]]]]:
    """Call to read the wake-ups published on WAKE so far."""
    subscriber = pubsub_client(redis_url)
    pubsub = subscriber.pubsub()
    await pubsub.subscribe(WAKE)

    async def read() -> list[bytes]:
        out = []
        deadline = time.monotonic() + 0.3  # None also answers a subscribe confirmation: read on
        while time.monotonic() < deadline:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if message is not None:
                out.append(message["data"])
        return out

    yield read
    await pubsub.aclose()
    await subscriber.aclose()


async def test_a_lease_not_renewed_lapses_and_the_job_is_back_with_a_wake(
    redis: ArqRedis, wakes: Callable[[], Awaitable[list[bytes]]]
) -> None:
    job_id = await enqueue(redis, b"work")
    # A lease long enough that the check below runs inside it on a busy machine too.
    dead = arq_worker(redis, hang, lease_s=1.0)
    await dead.poll()
    assert dead.held() == [job_id]
    lease = await redis.zscore(keys.lease_key(QUEUE), job_id)
    assert lease is not None and lease > time.time() * 1000, "the claim leased the job"
    live = arq_worker(redis, hang)
    keeper = LeaseKeeper(redis, [live], lease_s=LEASE_S)
    assert await keeper.beat() == [], "a lease within its time is not touched"
    await until_lapsed(redis, QUEUE, job_id)
    assert await keeper.beat() == [job_id]
    assert not await redis.exists(arq.constants.in_progress_key_prefix + job_id)
    assert await redis.zscore(QUEUE, job_id) is not None, "the job is due on its queue again"
    assert await redis.get(keys.crashes_key(job_id)) == b"1"
    assert await wakes() == [b"requeued"]
    assert await keeper.beat() == [], "put back once"

    seen: list[int] = []

    async def record(ctx: dict[str, Any], payload: bytes) -> bytes:
        seen.append(taker.crashes[str(ctx["job_id"])])
        return payload

    taker = arq_worker(redis, record)
    await taker.poll()
    await asyncio.gather(*taker.running())
    assert seen == [1], "another worker ran it, and knew it had crashed once"
    for task in dead.running():
        task.cancel()


async def test_a_renewed_lease_does_not_lapse_during_a_long_forward(
    redis: ArqRedis, wakes: Callable[[], Awaitable[list[bytes]]]
) -> None:
    runs: list[bytes] = []

    async def forward(ctx: dict[str, Any], payload: bytes) -> None:
        runs.append(payload)
        # Longer than several leases, in a thread as a forward is: the event loop stays free.
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, 4 * LEASE_S)

    worker = arq_worker(redis, forward)
    job_id = await enqueue(redis, b"long")
    keeper = LeaseKeeper(redis, [worker], lease_s=LEASE_S, renew_s=LEASE_S / 4)
    renewing = asyncio.create_task(keeper.run())
    other = LeaseKeeper(redis, [arq_worker(redis, hang)], lease_s=LEASE_S)
    await worker.poll()
    requeued: list[str] = []
    deadline = time.monotonic() + 30
    while worker.held():
        assert time.monotonic() < deadline, "the forward never ended"
        requeued += await other.beat()
        await asyncio.sleep(LEASE_S / 3)
    keeper.stop()
    await renewing
    await keeper.beat()  # the next renewal after the job ended
    assert runs == [b"long"] and requeued == []
    assert await redis.get(keys.crashes_key(job_id)) is None
    assert await wakes() == []
    assert await redis.zscore(keys.lease_key(QUEUE), job_id) is None, "a finished job's lease is dropped"


@pytest.fixture
async def isolating_worker(
    redis: ArqRedis, redis_url: str, deployment: Deployment, stats: Stats
) -> AsyncIterator[Callable[[], Awaitable[DeviceWorker]]]:
    """Call to start a device worker with short leases (after the test has set up its jobs)."""
    started: list[DeviceWorker] = []

    async def start() -> DeviceWorker:
        worker = DeviceWorker(
            redis_url=redis_url,
            deployments=[deployment],
            stats=stats,
            poll_delay_s=0.2,
            lease_s=LEASE_S,
            lease_renew_s=0.1,
        )
        await worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.close()


def interactive_job(model: LoadedModel, items: list[WorkItem]) -> bytes:
    return protocol.encode(
        protocol.JobPayload(
            deployment=model.info.name,
            model_sha256=model.info.model_sha256,
            numerics=model.info.numerics,
            items=items,
            reply_to="test:reply",
            request_id="r1",
            enqueued_s=time.time(),
            ttl_s=60,
        )
    )


async def reply_to_job(redis_url: str, start: Callable[[], Awaitable[DeviceWorker]]) -> protocol.JobReply:
    subscriber = pubsub_client(redis_url)
    pubsub = subscriber.pubsub()
    await pubsub.subscribe("test:reply")
    try:
        await start()
        async with asyncio.timeout(10):
            while (message := await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)) is None:
                pass
        return protocol.decode_reply(message["data"])
    finally:
        await pubsub.aclose()
        await subscriber.aclose()


async def lapse(redis: ArqRedis, queue: str, job_id: str, times: int) -> None:
    """`times` workers claim the job and die with it; another process's reaper puts it back."""
    for _ in range(times):
        dead = arq_worker(redis, hang, queue=queue)
        await dead.poll()
        assert dead.held() == [job_id]
        await until_lapsed(redis, queue, job_id)
        assert await LeaseKeeper(redis, [arq_worker(redis, hang, queue=queue)]).beat() == [job_id]
        for task in dead.running():
            task.cancel()
        dead.tasks.clear()


async def test_a_job_whose_lease_lapsed_twice_runs_isolated(
    redis: ArqRedis,
    redis_url: str,
    keywords_model: LoadedModel,
    classify_items: Callable[..., list[WorkItem]],
    isolating_worker: Callable[[], Awaitable[DeviceWorker]],
    batches: list[int],
) -> None:
    items = classify_items("refund please", "parcel delivery", "invoice charge")
    queue = keys.queue_name(keywords_model.info.name)
    job_id = await enqueue(redis, interactive_job(keywords_model, items), queue=queue)
    await lapse(redis, queue, job_id, 2)
    assert await redis.get(keys.crashes_key(job_id)) == b"2"
    reply = await reply_to_job(redis_url, isolating_worker)
    expected = keywords_model.run(items)
    for raw, want in zip(reply.results, expected, strict=True):
        np.testing.assert_array_equal(decode_result(raw), want)
    assert batches == [], "no coalesced batch: each item ran in a forward of its own"
    marks = await redis.hgetall(keys.isolation_key(job_id))
    assert marks == {item.cache_key.encode(): b"0" for item in items}, "each solo forward began and ended"


async def test_an_item_whose_solo_forward_never_ended_fails_alone(
    redis: ArqRedis,
    redis_url: str,
    keywords_model: LoadedModel,
    classify_items: Callable[..., list[WorkItem]],
    isolating_worker: Callable[[], Awaitable[DeviceWorker]],
) -> None:
    items = classify_items("refund please", "parcel delivery", "invoice charge")
    queue = keys.queue_name(keywords_model.info.name)
    job_id = await enqueue(redis, interactive_job(keywords_model, items), queue=queue)
    await lapse(redis, queue, job_id, 3)
    # What the third run left behind: it was forwarding the second item alone when it died.
    await redis.hset(keys.isolation_key(job_id), items[1].cache_key, "1")
    reply = await reply_to_job(redis_url, isolating_worker)
    results = [decode_result(raw) for raw in reply.results]
    assert isinstance(results[1], ItemError) and results[1].code == "unavailable"
    expected = keywords_model.run(items)
    np.testing.assert_array_equal(results[0], expected[0])
    np.testing.assert_array_equal(results[2], expected[2])
    stored = await redis.mget([keys.result_key(keywords_model.info.name, i.cache_key) for i in items])
    assert stored[0] is not None and stored[1] is None and stored[2] is not None, "errors are never cached"


async def test_a_stopping_worker_gives_its_jobs_back_without_a_crash(
    redis: ArqRedis, wakes: Callable[[], Awaitable[list[bytes]]]
) -> None:
    job_id = await enqueue(redis, b"work")
    worker = arq_worker(redis, hang)
    await worker.poll()
    await LeaseKeeper(redis, [worker]).release_all()
    assert not await redis.exists(arq.constants.in_progress_key_prefix + job_id)
    assert await redis.zscore(keys.lease_key(QUEUE), job_id) is None
    assert await redis.get(keys.crashes_key(job_id)) is None
    assert await wakes() == [b"released"]
    for task in worker.running():
        task.cancel()

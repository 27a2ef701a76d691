"""The device worker in process: a real Redis, the keyword model on its counting engine.

Jobs are written as the app writes them (arq_compat.add_job and a wake-up); replies are read
from the reply channel the job names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from arq.connections import ArqRedis

from vllm_srun.plugins.base import ItemError, LoadedModel, WorkItem
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.arq_compat import add_job
from vllm_srun.queue.redis import pubsub_client
from vllm_srun.queue.results import decode_result
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker

Planner = Callable[..., list[WorkItem]]


Sent = tuple[protocol.JobReply, list[bytes | None]]
Send = Callable[..., Awaitable[Sent]]


@pytest.fixture
def send(redis: ArqRedis, redis_url: str, keywords_model: LoadedModel) -> Send:
    """Call with work items (and JobPayload fields to override) to send one job."""

    async def send(items: list[WorkItem], **fields: object) -> Sent:
        return await run_job(redis, redis_url, keywords_model, items, **fields)

    return send


async def run_job(
    redis: ArqRedis, redis_url: str, model: LoadedModel, items: list[WorkItem], **fields: object
) -> Sent:
    """Enqueue one job, wait for its reply; also what the cache held when the reply came."""
    name = model.info.name
    payload = protocol.JobPayload(
        **{
            "deployment": name,
            "model_sha256": model.info.model_sha256,
            "numerics": model.info.numerics,
            "items": items,
            "reply_to": "test:reply",
            "request_id": "r1",
            "enqueued_s": time.time(),
            "ttl_s": 60,
            **fields,
        }
    )
    subscriber = pubsub_client(redis_url)
    pubsub = subscriber.pubsub()
    await pubsub.subscribe("test:reply")
    try:
        async with redis.pipeline(transaction=True) as pipe:
            add_job(
                pipe,
                queue=keys.queue_name(name),
                function=keys.RUN_ITEMS,
                payload=protocol.encode(payload),
                expires_s=60,
            )
            pipe.publish(keys.wake_channel(name), b"1")
            await pipe.execute()
        message = None
        async with asyncio.timeout(5):  # the wake-up starts the job, not the 5 s fallback poll
            while message is None:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
        stored = await redis.mget([keys.result_key(name, i.cache_key) for i in items])
    finally:
        await pubsub.aclose()
        await subscriber.aclose()
    return protocol.decode_reply(message["data"]), stored


async def test_a_job_is_answered_by_push_and_stored_before_the_reply(
    worker: DeviceWorker, send: Send, keywords_model: LoadedModel, batches: list[int], classify_items: Planner
) -> None:
    items = classify_items("refund my invoice", "parcel delivery late")
    reply, stored = await send(items)
    expected = keywords_model.run(items)
    assert reply.request_id == "r1" and len(reply.results) == 2
    for raw, cached, want in zip(reply.results, stored, expected, strict=True):
        np.testing.assert_array_equal(decode_result(raw), want)
        assert cached == raw  # in the result cache, as binary float32, before the reply
    assert sum(batches) == 2


async def test_a_job_planned_for_another_model_fails_its_items_and_caches_nothing(
    worker: DeviceWorker, send: Send, batches: list[int], classify_items: Planner
) -> None:
    items = classify_items("refund")
    reply, stored = await send(items, model_sha256="0" * 64)
    error = decode_result(reply.results[0])
    assert isinstance(error, ItemError) and error.code == "unavailable"
    assert "serve the same package on both" in error.message
    assert stored == [None] and sum(batches) == 0

    reply, _ = await send(items, numerics="int8")
    error = decode_result(reply.results[0])
    assert isinstance(error, ItemError) and "numerics" in error.message


async def test_a_worker_announces_what_it_serves_and_withdraws_on_close(
    redis_url: str, redis: ArqRedis, deployment: Deployment, stats: Stats
) -> None:
    name = deployment.name
    worker = DeviceWorker(redis_url=redis_url, deployments=[], stats=stats)
    await worker.start()
    try:
        assert await redis.zcard(keys.worker_key(name)) == 0
        await worker.add(deployment)  # a model that became ready later
        assert await redis.zcount(keys.worker_key(name), int(time.time() * 1000), "+inf") == 1
        assert name in worker.coalescers
    finally:
        await worker.close()
    assert await redis.zcard(keys.worker_key(name)) == 0


async def test_a_withdrawn_request_is_dropped_before_it_runs(
    worker: DeviceWorker, send: Send, redis: ArqRedis, batches: list[int], classify_items: Planner
) -> None:
    name = next(iter(worker.deployments))
    await worker.coalescers[name].close()  # nothing forwards: the job's items stay queued
    task = asyncio.create_task(send(classify_items("refund"), request_id="gone"))
    deadline = time.monotonic() + 10
    while "gone" not in worker._active:  # the worker took the job: its cancel will be heard
        assert time.monotonic() < deadline, "the worker never took the job"
        await asyncio.sleep(0.02)
    await redis.publish(keys.cancel_channel(name), b"gone")
    reply, stored = await task
    error = decode_result(reply.results[0])
    assert isinstance(error, ItemError) and error.code == "cancelled"
    assert stored == [None] and sum(batches) == 0

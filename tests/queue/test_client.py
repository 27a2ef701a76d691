"""The app's queue client in process, against a real Redis and an in-process device worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from vllm_srun.errors import NotReady
from vllm_srun.plugins.base import ItemError, LoadedModel, WorkItem
from vllm_srun.queue import keys
from vllm_srun.queue.client import QueueClient, Submission
from vllm_srun.queue.results import encode_result
from vllm_srun.queue.worker import DeviceWorker


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[QueueClient]:
    client = QueueClient(redis_url, result_ttl_s=60)
    await client.start()
    yield client
    await client.close()


Planner = Callable[..., list[WorkItem]]


async def submit(
    client: QueueClient, model: LoadedModel, items: list[WorkItem], timeout_s: float = 5.0
) -> Submission:
    return await client.submit(
        model.info.name, model.info.model_sha256, items, numerics=model.info.numerics, timeout_s=timeout_s
    )


async def test_without_a_worker_a_miss_is_not_ready(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    with pytest.raises(NotReady):
        await submit(client, keywords_model, classify_items("refund"))
    assert (await submit(client, keywords_model, [])).results == []


async def test_misses_are_forwarded_once_then_answered_from_the_caches(
    client: QueueClient,
    worker: DeviceWorker,
    redis_url: str,
    keywords_model: LoadedModel,
    batches: list[int],
    classify_items: Planner,
) -> None:
    items = classify_items("refund my invoice", "parcel delivery", "refund my invoice")
    started = time.monotonic()
    first = await submit(client, keywords_model, items)
    assert time.monotonic() - started < 2.0  # woken by push, not the worker's 5 s poll
    assert (first.hits, first.misses) == (0, 3) and sum(batches) == 2  # the repeated text ran once
    for got, want in zip(first.results, keywords_model.run(items), strict=True):
        np.testing.assert_array_equal(got, want)
    assert first.forward_s >= 0 and first.queue_s >= 0

    again = await submit(client, keywords_model, items)  # this process's copy
    assert (again.hits, again.misses) == (3, 0) and sum(batches) == 2

    other = QueueClient(redis_url, result_ttl_s=60, local_cache_bytes=0)  # another replica
    await other.start()
    try:
        shared = await submit(other, keywords_model, items)
    finally:
        await other.close()
    assert shared.hits == 3 and sum(batches) == 2
    np.testing.assert_array_equal(shared.results[1], first.results[1])


async def test_concurrent_requests_for_the_same_text_share_one_forward(
    client: QueueClient,
    worker: DeviceWorker,
    keywords_model: LoadedModel,
    batches: list[int],
    classify_items: Planner,
) -> None:
    items = classify_items("charge on my invoice")
    answers = await asyncio.gather(*(submit(client, keywords_model, items) for _ in range(5)))
    assert sum(batches) == 1
    assert sum(a.misses for a in answers) == 5  # waiting on work in flight is not a hit
    for answer in answers:
        np.testing.assert_array_equal(answer.results[0], answers[0].results[0])


async def test_a_request_nobody_answers_times_out_per_item(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    # A worker that heartbeats but never takes the job (it died after its last beat).
    name = keywords_model.info.name
    await client.redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) + 60_000})
    got = await submit(client, keywords_model, classify_items("refund"), timeout_s=0.3)
    result = got.results[0]
    assert isinstance(result, ItemError) and result.code == "deadline_exceeded"
    # Nobody waits for it any more: the job left the queue rather than run for no one.
    assert await client.redis.zcard(keys.queue_name(name)) == 0


async def test_a_result_stored_without_a_reply_is_found_by_the_fallback(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    # The reply message was lost, but the result reached the cache: the slow poll finds it.
    name = keywords_model.info.name
    items = classify_items("parcel")
    await client.redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) + 60_000})
    task = asyncio.create_task(submit(client, keywords_model, items, timeout_s=5.0))
    await asyncio.sleep(0.2)
    array = keywords_model.run(items)[0]
    await client.redis.set(keys.result_key(name, items[0].cache_key), encode_result(array))
    got = await asyncio.wait_for(task, 4)
    np.testing.assert_array_equal(got.results[0], array)


async def test_a_cancelled_request_takes_its_job_out_of_the_queue(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    name = keywords_model.info.name
    await client.redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) + 60_000})
    task = asyncio.create_task(submit(client, keywords_model, classify_items("refund")))
    for _ in range(100):
        if await client.redis.zcard(keys.queue_name(name)):
            break
        await asyncio.sleep(0.01)
    assert await client.redis.zcard(keys.queue_name(name)) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.redis.zcard(keys.queue_name(name)) == 0

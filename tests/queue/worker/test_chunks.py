"""The chunk runner in process: a real Redis, the keyword model behind a real coalescer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from arq.connections import ArqRedis

from vllm_srun.plugins.stats import Stats
from vllm_srun.plugins.surfaces import ClassifyRequest
from vllm_srun.queue import keys
from vllm_srun.queue.jobs import BulkStore
from vllm_srun.queue.planning import plan_with_keys
from vllm_srun.queue.protocol import ChunkPayload
from vllm_srun.queue.worker.chunks import ChunkRunner
from vllm_srun.queue.worker.coalescer import Coalescer
from vllm_srun.queue.worker.device_worker import Deployment

REQUESTS = [
    b'{"input": ["refund my invoice", "parcel delivery"]}',
    b'{"input": "refund my invoice"}',
    b'{"input": 3}',  # not a classify request: that line fails alone
]


@pytest.fixture
async def coalescer(deployment: Deployment, stats: Stats) -> AsyncIterator[Coalescer]:
    coalescer = Coalescer(
        deployment.model, limits=deployment.limits, executor=deployment.executor, stats=stats
    )
    coalescer.start()
    yield coalescer
    await coalescer.close()


async def run_job(runner: ChunkRunner, store: BulkStore, name: str) -> tuple[str, list[Any]]:
    """Create a job of REQUESTS, run it as one chunk; its id and its result lines."""
    job, _ = await store.create(
        deployment=name, surface="classify", requests=REQUESTS, custom_ids=["a", "b", "c"], errors={}
    )
    done = await runner.run(ChunkPayload(job.id, name, "classify", 0, 0, len(REQUESTS), 1))
    assert done == len(REQUESTS)
    return job.id, [msgspec.json.decode(raw) for raw in await store.results(job.id, 0, 10)]


async def test_a_chunk_answers_what_the_interactive_surface_answers_and_fills_the_cache(
    redis: ArqRedis, coalescer: Coalescer, batches: list[int]
) -> None:
    model = coalescer.model
    name = model.info.name
    store = BulkStore(redis, ttl_s=60)
    runner = ChunkRunner(redis, store, {name: coalescer}, 60)
    first, lines = await run_job(runner, store, name)
    assert [line["custom_id"] for line in lines] == ["a", "b", "c"]
    assert sum(batches) == 2  # "refund my invoice" twice in the chunk, run once

    request = ClassifyRequest(input=["refund my invoice", "parcel delivery"])
    plan = plan_with_keys(model, "classify", request)
    expected = msgspec.json.decode(msgspec.json.encode(model.finish_surface(plan, model.run(plan.items))))
    assert lines[0]["response"] == expected
    assert lines[2]["error"]["code"] == "invalid_request"
    for item in plan.items:  # interactive requests for these texts are now hits
        assert await redis.exists(keys.result_key(name, item.cache_key))

    # The same requests again: every result from the cache, counted as cached.
    second, again = await run_job(runner, store, name)
    assert sum(batches) == 2
    assert again[0]["response"] == expected
    assert (await store.get(first)).counts.cached == 0
    assert (await store.get(second)).counts.cached == 2  # the invalid line is failed, not cached


async def test_a_cancelled_job_skips_its_requests_and_runs_nothing(
    redis: ArqRedis, coalescer: Coalescer, batches: list[int]
) -> None:
    name = coalescer.model.info.name
    store = BulkStore(redis, ttl_s=60)
    runner = ChunkRunner(redis, store, {name: coalescer}, 60)
    job, _ = await store.create(
        deployment=name, surface="classify", requests=REQUESTS, custom_ids=[""] * 3, errors={}
    )
    await store.cancel(job.id)
    await runner.run(ChunkPayload(job.id, name, "classify", 0, 0, 3, 1))
    status = await store.get(job.id)
    assert status.status == "cancelled" and status.counts.failed == 3 and sum(batches) == 0
    lines = [msgspec.json.decode(raw) for raw in await store.results(job.id, 0, 10)]
    assert {line["error"]["code"] for line in lines} == {"cancelled"}


async def test_a_chunk_for_a_model_this_worker_does_not_serve_fails_its_requests(
    redis: ArqRedis, coalescer: Coalescer
) -> None:
    store = BulkStore(redis, ttl_s=60)
    runner = ChunkRunner(redis, store, {}, 60)
    job, _ = await store.create(
        deployment="other", surface="classify", requests=REQUESTS[:1], custom_ids=[""], errors={}
    )
    await runner.run(ChunkPayload(job.id, "other", "classify", 0, 0, 1, 1))
    status = await store.get(job.id)
    assert status.status == "failed"
    line = msgspec.json.decode((await store.results(job.id, 0, 1))[0])
    assert "does not serve 'other'" in line["error"]["message"]


async def test_an_expired_job_is_nothing_to_run(redis: ArqRedis, coalescer: Coalescer) -> None:
    runner = ChunkRunner(redis, BulkStore(redis, ttl_s=60), {}, 60)
    assert await runner.run(ChunkPayload("job_" + "0" * 32, "m", "classify", 0, 0, 1, 1)) == 0

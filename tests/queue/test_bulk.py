"""The bulk job store in process, against a real Redis: creation, chunk results, counts, status."""

from __future__ import annotations

import msgspec
import pytest
from arq.connections import ArqRedis
from arq.jobs import Job

from vllm_srun.errors import JobNotFound, Unavailable
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.bulk import CACHED, DONE, FAILED, SKIPPED, BulkStore, ResultLine, error_body, result_line


def requests(n: int) -> list[bytes]:
    return [msgspec.json.encode({"input": f"text {i}"}) for i in range(n)]


def line(index: int, kind: str) -> ResultLine:
    body = error_body("x", "failed") if kind in (FAILED, SKIPPED) else b'{"ok":true}'
    return ResultLine(index, kind, result_line(index, f"c{index}", body, error=kind in (FAILED, SKIPPED)))


async def test_a_job_is_split_into_chunk_jobs_arq_can_read(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60, chunk_size=2)
    job, new = await store.create(
        deployment="m",
        surface="classify",
        requests=requests(5),
        custom_ids=["a", "", "c", "d", "e"],
        errors={},
    )
    assert new and job.status == "queued" and job.counts.total == 5
    queued = await redis.zrange(keys.bulk_queue_name("m"), 0, -1)
    assert len(queued) == 3
    chunks = []
    for job_id in queued:
        info = await Job(job_id.decode(), redis, _deserializer=protocol.deserialize).info()
        assert info is not None and info.function == keys.RUN_CHUNK
        chunks.append(protocol.decode_chunk(info.args[0]))
    assert sorted((c.start, c.end) for c in chunks) == [(0, 2), (2, 4), (4, 5)]
    assert {c.job_id for c in chunks} == {job.id} and {c.chunks for c in chunks} == {3}
    assert await redis.lrange(keys.job_custom_ids_key(job.id), 0, -1) == [b"a", b"", b"c", b"d", b"e"]


async def test_each_result_kind_is_counted_once_and_the_job_completes(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60, chunk_size=2)
    job, _ = await store.create(
        deployment="m", surface="classify", requests=requests(4), custom_ids=[""] * 4, errors={}
    )
    await store.store_chunk(job.id, 0, 2, [line(0, DONE), line(1, CACHED)])
    await store.store_chunk(job.id, 0, 2, [line(0, DONE), line(1, CACHED)])  # a retried chunk
    status = await store.get(job.id)
    assert (status.counts.done, status.counts.cached, status.counts.failed) == (2, 1, 0)
    assert status.status == "queued"
    await store.store_chunk(job.id, 1, 2, [line(2, FAILED), line(3, DONE)])
    status = await store.get(job.id)
    assert (status.counts.done, status.counts.cached, status.counts.failed) == (3, 1, 1)
    assert status.status == "completed" and status.finished_at is not None
    lines = await store.results(job.id, 0, 10)
    assert [msgspec.json.decode(raw)["index"] for raw in lines] == [0, 1, 2, 3]
    events = [(name, data) async for _, name, data in store.events(job.id, block_ms=100)]
    assert [n for n, _ in events].count("result") == 4  # the retry streamed nothing twice
    assert events[-1] == ("status", b'{"status":"completed"}')


async def test_a_cancelled_job_ends_cancelled_once_its_skipped_requests_are_stored(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60, chunk_size=2)
    job, _ = await store.create(
        deployment="m", surface="classify", requests=requests(2), custom_ids=["", ""], errors={}
    )
    assert (await store.cancel(job.id)).status == "cancelling"
    await store.mark_running(job.id)  # a chunk starting late never undoes the cancel
    assert (await store.get(job.id)).status == "cancelling"
    await store.store_chunk(job.id, 0, 1, [line(0, SKIPPED), line(1, SKIPPED)])
    status = await store.get(job.id)
    assert status.status == "cancelled" and status.counts.failed == 2 and status.counts.done == 0
    assert (await store.cancel(job.id)).status == "cancelled"  # a final status stays


async def test_all_failed_is_failed_and_prerecorded_errors_count(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60, chunk_size=10)
    bad = error_body("invalid_request", "input: required")
    job, _ = await store.create(
        deployment="m", surface="classify", requests=requests(2), custom_ids=["", ""], errors={0: bad}
    )
    assert (await store.get(job.id)).counts.failed == 1
    await store.store_chunk(job.id, 0, 1, [line(0, FAILED), line(1, FAILED)])  # index 0 already stored
    status = await store.get(job.id)
    assert status.status == "failed" and status.counts.failed == 2
    first = msgspec.json.decode((await store.results(job.id, 0, 1))[0])
    assert first["error"]["code"] == "invalid_request"


async def test_an_idempotency_key_returns_the_first_job_and_unknown_ids_are_not_found(
    redis: ArqRedis,
) -> None:
    store = BulkStore(redis, ttl_s=60)
    made = [
        await store.create(
            deployment="m",
            surface="classify",
            requests=requests(1),
            custom_ids=[""],
            errors={},
            idempotency_key="k",
        )
        for _ in range(2)
    ]
    (first, new), (again, new_again) = made
    assert new and not new_again and again.id == first.id
    for job_id in ("job_" + "0" * 32, first.id + ":results", "../x"):
        with pytest.raises(JobNotFound):
            await store.get(job_id)


async def test_a_key_whose_job_is_still_being_written_makes_no_second_job(redis: ArqRedis) -> None:
    """The key is set before the job's transaction is sent: a retry that finds the key but not
    yet its job is told to retry (503), not given a second job; once the claim is old, the job
    counts as lost and the key is taken over."""
    import time

    store = BulkStore(redis, ttl_s=60)
    idem = keys.idempotency_key("m", "k")

    async def create() -> tuple[str, bool]:
        job, new = await store.create(
            deployment="m",
            surface="classify",
            requests=requests(1),
            custom_ids=[""],
            errors={},
            idempotency_key="k",
        )
        return job.id, new

    pending = "job_" + "1" * 32
    await redis.set(idem, f"{pending} {time.time()}")
    with pytest.raises(Unavailable):
        await create()
    assert await redis.zcard(keys.bulk_queue_name("m")) == 0, "no second job was made"
    await redis.set(idem, f"{pending} {time.time() - 3600}")
    job_id, new = await create()
    assert new and job_id != pending
    assert await create() == (job_id, False)


async def test_results_stop_at_the_first_request_not_yet_stored(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60, chunk_size=1)
    job, _ = await store.create(
        deployment="m", surface="classify", requests=requests(3), custom_ids=[""] * 3, errors={}
    )
    await store.store_chunk(job.id, 0, 3, [line(0, DONE)])
    await store.store_chunk(job.id, 2, 3, [line(2, DONE)])
    assert len(await store.results(job.id, 0, 10)) == 1
    assert len(await store.results(job.id, 2, 10)) == 1

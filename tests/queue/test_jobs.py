"""The bulk job store in process, against a real Redis: creation, chunk results, counts, status."""

from __future__ import annotations

import msgspec
import pytest
from arq.connections import ArqRedis
from arq.jobs import Job

from vllm_srun.errors import JobNotFound, Overloaded, Unavailable
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.jobs import (
    CACHED,
    DONE,
    FAILED,
    SKIPPED,
    BulkQuotas,
    BulkStore,
    ResultLine,
    error_body,
    result_line,
)
from vllm_srun.queue.jobs.records import head_length


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


# Bounded state (issue 22, H3): what jobs may hold in the state Redis, which never evicts.


async def make(store: BulkStore, n: int, *, model: str = "m") -> str:
    job, _ = await store.create(
        deployment=model, surface="classify", requests=requests(n), custom_ids=[""] * n, errors={}
    )
    return job.id


async def test_queued_items_of_all_jobs_are_bounded_and_freed_as_results_are_stored(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60, chunk_size=4, quotas=BulkQuotas(max_queued_items=10))
    first = await make(store, 6)
    await make(store, 2, model="other")  # across models: one Redis holds them all
    with pytest.raises(Overloaded) as refused:
        await make(store, 3)
    assert "10 items queued for all jobs (--max-queued-job-items; 8 are queued now)" in refused.value.message
    assert refused.value.headers["Retry-After"]
    # A refused job left nothing behind: no job, no chunk, no accounting.
    assert len(await redis.zrange(keys.bulk_queue_name("m"), 0, -1)) == 2
    await store.store_chunk(first, 0, 2, [line(i, DONE) for i in range(4)])
    await make(store, 3)  # 4 stored: 4 queued + 3 fits
    # A finished job's items are all out, whatever it stored (here: the rest failed at once).
    await store.store_chunk(first, 1, 2, [line(4, FAILED), line(5, DONE)])
    totals = await redis.hgetall(keys.jobs_totals_key())
    assert int(totals[b"items"]) == 2 + 3


async def test_a_job_past_its_result_bytes_stores_errors_naming_the_limit_and_completes(
    redis: ArqRedis,
) -> None:
    one = len(line(0, DONE).line)
    store = BulkStore(redis, ttl_s=60, chunk_size=10, quotas=BulkQuotas(max_job_result_bytes=3 * one))
    job_id = await make(store, 5)
    await store.store_chunk(job_id, 0, 1, [line(i, DONE) for i in range(5)])
    job = await store.get(job_id)
    assert job.status == "completed" and (job.counts.done, job.counts.failed) == (3, 2)
    lines = [msgspec.json.decode(raw) for raw in await store.results(job_id, 0, 10)]
    assert [x.get("response") for x in lines[:3]] == [{"ok": True}] * 3
    for index, refused in enumerate(lines[3:], start=3):
        assert refused["index"] == index and refused["custom_id"] == f"c{index}"
        assert refused["error"]["code"] == "result_too_large"
        assert f"{3 * one} bytes of results per job (--max-job-result-bytes)" in refused["error"]["message"]
    stored = int((await redis.hgetall(keys.jobs_totals_key()))[b"bytes"])
    assert 3 * one <= stored <= 3 * one + 2 * 200


async def test_stored_result_bytes_of_all_jobs_refuse_new_jobs_until_old_ones_expire(redis: ArqRedis) -> None:
    one = len(line(0, DONE).line)
    quotas = BulkQuotas(max_stored_result_bytes=4 * one)
    store = BulkStore(redis, ttl_s=60, chunk_size=10, quotas=quotas)
    first = await make(store, 3)
    second = await make(store, 3)
    await store.store_chunk(first, 0, 1, [line(i, DONE) for i in range(3)])
    await store.store_chunk(second, 0, 1, [line(i, DONE) for i in range(3)])
    # The second job stored one more within the bound, and errors for the rest.
    assert (await store.get(second)).counts.done == 1
    with pytest.raises(Overloaded) as refused:
        await make(store, 1)
    assert f"at most {4 * one} (--max-stored-result-bytes)" in refused.value.message
    # Once the jobs' data has expired, their bytes are forgotten and jobs are admitted again
    # (the refused results' error lines count too: each item stores at least that).
    await redis.zadd(keys.jobs_live_key(), {first: 1.0, second: 1.0})
    await make(store, 1)
    assert int((await redis.hgetall(keys.jobs_totals_key()))[b"bytes"]) == 0


async def test_a_full_state_redis_is_unavailable_not_an_error(redis: ArqRedis) -> None:
    store = BulkStore(redis, ttl_s=60)
    await redis.config_set("maxmemory", "1")
    try:
        with pytest.raises(Unavailable) as full:
            await make(store, 3)
    finally:
        await redis.config_set("maxmemory", "0")
    assert "state Redis is full" in full.value.message and full.value.headers["Retry-After"]


@pytest.mark.parametrize("custom_id", ["", "plain", 'with "quotes" and \\ and ,"response":'])
def test_the_head_a_refused_line_keeps_is_index_and_custom_id(custom_id: str) -> None:
    full = result_line(7, custom_id, b'{"x":1}')
    head = full[: head_length(full)]
    assert msgspec.json.decode(head + b',"error":{}}') == {
        "index": 7,
        "custom_id": custom_id or None,
        "error": {},
    }


async def test_a_chunks_lines_are_one_stream_entry_yet_a_reader_resumes_after_any_line(
    redis: ArqRedis,
) -> None:
    """The chunk script writes one `results` entry per chunk; a reader sends a `result` event
    per line, each with an id of its own in stream order, and a reader resumed from any of
    them gets exactly the lines after it."""
    store = BulkStore(redis, ttl_s=60, chunk_size=5)
    job, _ = await store.create(
        deployment="m", surface="classify", requests=requests(10), custom_ids=[""] * 10, errors={}
    )
    await store.store_chunk(job.id, 0, 2, [line(i, DONE) for i in range(5)])
    await store.store_chunk(job.id, 0, 2, [line(i, DONE) for i in range(5)])  # a retried chunk
    await store.store_chunk(job.id, 1, 2, [line(i, DONE) for i in (5, 6, 8, 9, 7)])
    # Per chunk its lines and its progress, the retry only its progress, and the final status.
    assert await redis.xlen(keys.job_events_key(job.id)) == 2 + 1 + 3
    events = [(event_id, name, data) async for event_id, name, data in store.events(job.id, block_ms=100)]
    results = [(event_id, msgspec.json.decode(data)["index"]) for event_id, name, data in events if name == "result"]
    assert [index for _, index in results] == [0, 1, 2, 3, 4, 5, 6, 8, 9, 7]
    ids = [tuple(int(part) for part in event_id.split("-")) for event_id, _, _ in events]
    assert ids == sorted(set(ids)), "every event has its own id, in stream order"
    for position, (event_id, _) in enumerate(results):
        resumed = [data async for _, name, data in store.events(job.id, event_id, block_ms=100) if name == "result"]
        assert [msgspec.json.decode(raw)["index"] for raw in resumed] == [i for _, i in results[position + 1 :]]

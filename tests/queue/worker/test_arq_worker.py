"""What the worker side takes from arq beyond its public API (vllm_srun/queue/worker/arq_worker.py)
still holds; moved here from tests/queue/test_arq_compat.py with the module it tests.

Each failure names what an arq upgrade changed, so the fix starts in arq_worker.py, not in a
stalled worker.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import arq
import arq.constants
from arq import Worker
from arq.connections import ArqRedis
from arq.jobs import Job, JobStatus
from arq.worker import func

from vllm_srun.queue import protocol
from vllm_srun.queue.arq_compat import add_job
from vllm_srun.queue.worker import arq_worker
from vllm_srun.queue.worker.arq_worker import DrivenWorker

QUEUE = "test:queue"


def test_the_private_worker_methods_exist_with_the_parameters_used() -> None:
    for name, params in arq_worker.WORKER_METHODS.items():
        method = getattr(Worker, name, None)
        assert method is not None, (
            f"arq {arq.VERSION}: Worker.{name} is gone; see vllm_srun/queue/worker/arq_worker.py"
        )
        found = tuple(inspect.signature(method).parameters)[1:]
        assert found == params, (
            f"arq {arq.VERSION}: Worker.{name} takes {found}, arq_worker.py calls it with {params}"
        )
    # The claim script counts a job's tries as arq's run_job does, and Finish ends a job as
    # arq's finish_job ends a finished one (no result kept).
    run_job = inspect.getsource(Worker.run_job)
    assert "pipe.incr(retry_key_prefix + job_id)" in run_job and "88400" in run_job, (
        f"arq {arq.VERSION}: run_job counts tries differently; update lua/claim_jobs.lua"
    )
    finish_job = inspect.getsource(Worker.finish_job)
    assert "delete_keys += [retry_key_prefix + job_id, job_key_prefix + job_id]" in finish_job, (
        f"arq {arq.VERSION}: finish_job deletes other keys; update Finish"
    )
    assert "tr.zrem(self.queue_name, job_id)" in finish_job, (
        f"arq {arq.VERSION}: finish_job no longer removes the queue entry; update Finish"
    )


async def test_a_worker_has_the_attributes_used(redis: ArqRedis) -> None:
    worker = DrivenWorker(functions=[func(_echo, name="echo")], redis_pool=redis, handle_signals=False)
    missing = [name for name in arq_worker.WORKER_ATTRIBUTES if not hasattr(worker, name)]
    assert not missing, f"arq {arq.VERSION}: Worker lost attributes arq_worker.py uses: {missing}"


async def test_a_driven_worker_claims_and_runs_hand_written_jobs(redis: ArqRedis) -> None:
    ran: list[bytes] = []

    async def record(ctx: dict[str, object], payload: bytes) -> int:
        assert ctx["redis"] is redis
        ran.append(payload)
        return len(payload)

    worker = DrivenWorker(
        functions=[func(record, name="record")],
        queue_name=QUEUE,
        redis_pool=redis,
        handle_signals=False,
        keep_result=0,
        job_serializer=protocol.serialize,
        job_deserializer=protocol.deserialize,
        max_jobs=2,
    )
    async with redis.pipeline(transaction=True) as pipe:
        ids = [
            add_job(pipe, queue=QUEUE, function="record", payload=bytes([i]), expires_s=60) for i in range(3)
        ]
        await pipe.execute()
    await worker.poll()  # claims two: max_jobs
    assert len(worker.running()) == 2
    for _ in range(20):
        await asyncio.gather(*worker.running())
        await worker.poll()
        if len(ran) == 3 and not worker.running():
            break
    assert sorted(ran) == [b"\x00", b"\x01", b"\x02"]
    assert worker.job_counter == 0, "arq's slot accounting drifted: _release_sem_dec_counter_on_complete"
    for job_id in ids:  # arq finished each: queue entry, job body and in-progress key gone
        assert await redis.zscore(QUEUE, job_id) is None
        assert not await redis.exists(arq.constants.job_key_prefix + job_id)
        assert not await redis.exists(arq.constants.in_progress_key_prefix + job_id)


async def _echo(ctx: dict[str, object], payload: bytes) -> bytes:
    return payload


async def test_a_lapsed_lease_leaves_the_job_as_arq_queues_it(redis: ArqRedis) -> None:
    """The requeue script undoes a claim in arq's own terms: arq reads the job as queued, not
    in progress, and a worker runs it again."""
    ran: list[bytes] = []

    async def hang(ctx: dict[str, object], payload: bytes) -> None:
        await asyncio.Event().wait()

    async def record(ctx: dict[str, object], payload: bytes) -> None:
        ran.append(payload)

    def worker(function: Callable[..., Awaitable[None]]) -> DrivenWorker:
        return DrivenWorker(
            functions=[func(function, name="run")],
            queue_name=QUEUE,
            redis_pool=redis,
            handle_signals=False,
            keep_result=0,
            job_serializer=protocol.serialize,
            job_deserializer=protocol.deserialize,
        )

    async with redis.pipeline(transaction=True) as pipe:
        job_id = add_job(pipe, queue=QUEUE, function="run", payload=b"again", expires_s=60)
        await pipe.execute()
    dead = worker(hang)
    await dead.poll()
    job = Job(job_id, redis, _queue_name=QUEUE, _deserializer=protocol.deserialize)
    assert await job.status() == JobStatus.in_progress
    assert await arq_worker.requeue_lapsed(redis, queue=QUEUE, wake_channel="", now_ms=2**50) == [
        job_id.encode()
    ]
    assert await job.status() == JobStatus.queued, f"arq {arq.VERSION} does not read a requeued job as queued"
    live = worker(record)
    await live.poll()
    await asyncio.gather(*live.running())
    assert ran == [b"again"]
    for task in dead.running():
        task.cancel()


async def test_a_job_that_sends_its_own_finish_is_acknowledged_with_its_writes(redis: ArqRedis) -> None:
    tries: list[object] = []

    async def store(ctx: dict[str, Any], payload: bytes) -> None:
        tries.append(ctx["job_try"])
        async with redis.pipeline(transaction=False) as pipe:
            pipe.set("test:stored", payload)
            ctx[arq_worker.FINISH].on(pipe)
            await pipe.execute()

    worker = DrivenWorker(
        functions=[func(store, name="store")],
        queue_name=QUEUE,
        redis_pool=redis,
        handle_signals=False,
        keep_result=0,
        job_serializer=protocol.serialize,
        job_deserializer=protocol.deserialize,
    )
    async with redis.pipeline(transaction=True) as pipe:
        job_id = add_job(pipe, queue=QUEUE, function="store", payload=b"done", expires_s=60)
        await pipe.execute()
    await worker.poll()
    await asyncio.gather(*worker.running())
    assert tries == [1] and await redis.get("test:stored") == b"done"
    assert worker.job_counter == 0 and worker.released() == [job_id]
    assert await redis.zscore(QUEUE, job_id) is None
    for prefix in (
        arq.constants.job_key_prefix,
        arq.constants.in_progress_key_prefix,
        arq.constants.retry_key_prefix,
    ):
        assert not await redis.exists(prefix + job_id), prefix


class _FlakyFinish(DrivenWorker):
    """A worker whose first `failures` finishes meet `error` (a failed-over master's), as the
    cluster client raised them mid-finish."""

    def __init__(self, *args: Any, failures: int, error: Exception, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures = failures
        self.error = error
        self.finishes = 0

    async def finish_job(self, job_id: str, finish: bool, *args: Any) -> None:
        self.finishes += 1
        if self.finishes <= self.failures:
            raise self.error
        await super().finish_job(job_id, finish, *args)


def _flaky(redis: ArqRedis, failures: int, error: Exception) -> _FlakyFinish:
    return _FlakyFinish(
        functions=[func(_echo, name="echo")],
        queue_name=QUEUE,
        redis_pool=redis,
        handle_signals=False,
        keep_result=0,
        job_serializer=protocol.serialize,
        job_deserializer=protocol.deserialize,
        failures=failures,
        error=error,
    )


async def test_a_finish_that_meets_a_lost_redis_lands_once_it_is_back(redis: ArqRedis) -> None:
    """Until its finish lands the job is held (its lease renewed), so Redis never keeps a job
    claimed with no lease: no worker would put that one back until its in-progress key expired."""
    worker = _flaky(redis, 2, ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."))
    async with redis.pipeline(transaction=True) as pipe:
        job_id = add_job(pipe, queue=QUEUE, function="echo", payload=b"x", expires_s=60)
        await pipe.execute()
    await worker.poll()
    for _ in range(100):
        if worker.finishes:
            break
        await asyncio.sleep(0.01)
    assert worker.held() == [job_id], "a job whose finish waits for Redis must keep its lease"
    assert worker.released() == []
    await asyncio.gather(*worker.running())
    assert worker.finishes == 3 and worker.released() == [job_id]
    assert await redis.zscore(QUEUE, job_id) is None
    assert not await redis.exists(arq.constants.in_progress_key_prefix + job_id)


async def test_a_job_whose_end_never_reached_redis_is_put_back_when_its_lease_lapses(redis: ArqRedis) -> None:
    worker = _flaky(redis, 1, ValueError("a bug in finishing"))
    async with redis.pipeline(transaction=True) as pipe:
        job_id = add_job(pipe, queue=QUEUE, function="echo", payload=b"x", expires_s=60)
        await pipe.execute()
    await worker.poll()
    ended = await asyncio.gather(*worker.running(), return_exceptions=True)
    assert [type(e) for e in ended] == [ValueError]
    assert worker.released() == [], "its lease was dropped: the job would stay claimed with no lease"
    assert await redis.zscore(worker.lease_key, job_id) is not None
    back = await arq_worker.requeue_lapsed(redis, queue=QUEUE, wake_channel="", now_ms=2**50)
    assert back == [job_id.encode()]
    assert not await redis.exists(arq.constants.in_progress_key_prefix + job_id)

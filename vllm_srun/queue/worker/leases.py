"""Leases, not timeouts: a dead worker's jobs run again within seconds; a poison input fails alone.

`LeaseKeeper` renews, every `LEASE_RENEW_S` from the event loop, the leases of the jobs its
process's workers hold, and puts back the jobs whose leases lapsed (`arq_worker.requeue_lapsed`):
a `kill -9`ed worker's job runs again within `LEASE_S + LEASE_RENEW_S` plus a claim. A job that
has killed `POISON_CRASHES` workers runs isolated (`run_isolated`), one item per forward, so the
item that kills a worker fails alone; from `MAX_CRASHES` on, nothing of it is forwarded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np
import structlog
from arq.connections import ArqRedis

from vllm_srun import defaults
from vllm_srun.plugins.base import ItemError, LoadedModel, Result, WorkItem
from vllm_srun.queue import keys
from vllm_srun.queue.gateway import write_back
from vllm_srun.queue.redis import REDIS_ERRORS, mget
from vllm_srun.queue.results import encode_result
from vllm_srun.queue.worker.arq_worker import DrivenWorker, release, requeue_lapsed

log = structlog.get_logger("vllm_srun.leases")


class LeaseKeeper:
    """Renews the leases of one process's arq workers and puts lapsed jobs back on their queues."""

    def __init__(
        self,
        redis: ArqRedis,
        workers: list[DrivenWorker],
        *,
        lease_s: float = defaults.LEASE_S,
        renew_s: float = defaults.LEASE_RENEW_S,
    ) -> None:
        self.redis = redis
        self.workers = workers  # the caller's list: workers added later are kept too
        self.lease_s = lease_s
        self.renew_s = renew_s
        self._stopping = False

    def stop(self) -> None:
        """End `run` at its next turn (a cancellation alone can be swallowed by redis-py)."""
        self._stopping = True

    async def run(self) -> None:
        # Every `renew_s` even while Redis is away (no backoff): once it is back, the leases of
        # work still running here must be renewed before any reaper finds them lapsed.
        failing = False
        while not self._stopping:
            try:
                requeued = await self.beat()
                failing = False
                if requeued:
                    log.warning("leases_lapsed", jobs=requeued)
            except Exception as exc:  # an ended keeper lets every lease lapse
                if not failing:  # one warning per outage (a lost Redis, or one refusing writes)
                    log.warning("lease_renewal_failed", error=repr(exc))
                failing = True
            await asyncio.sleep(self.renew_s)

    async def beat(self) -> list[str]:
        """Renew, drop and reap in one round trip; returns the ids of the jobs put back."""
        now_ms = int(time.time() * 1000)
        until = now_ms + int(self.lease_s * 1000)
        reaped: list[int] = []
        async with self.redis.pipeline(transaction=False) as pipe:
            for worker in self.workers:
                held = worker.held()
                if held:
                    pipe.zadd(worker.lease_key, dict.fromkeys(held, until), xx=True)
                finished = worker.released()
                if finished:
                    pipe.zrem(worker.lease_key, *finished)
                reaped.append(len(pipe))
                await requeue_lapsed(
                    pipe, queue=worker.queue_name, wake_channel=worker.wake_channel, now_ms=now_ms
                )
            replies = await pipe.execute()
        return [job_id.decode() for index in reaped for job_id in replies[index]]

    async def release_all(self) -> None:
        """Give every job held back to its queue now: this process stops and will not finish them."""
        for worker in self.workers:
            with contextlib.suppress(*REDIS_ERRORS):
                await release(
                    self.redis,
                    queue=worker.queue_name,
                    wake_channel=worker.wake_channel,
                    job_ids=worker.held(),
                )


def _failed(message: str) -> bytes:
    return encode_result(ItemError("unavailable", message))


async def run_isolated(
    redis: ArqRedis,
    *,
    job_id: str,
    deployment: str,
    model: LoadedModel,
    executor: Executor,
    items: Sequence[WorkItem],
    crashes: int,
    ttl_s: int,
    cache: ArqRedis | None = None,
) -> list[bytes]:
    """Encoded results for `items` of a job that crashed workers `crashes` times: one item per
    forward, each stored in the result cache (`cache`, else `redis`) as soon as it is done (see
    the module docstring). Results are stored here: callers report them as `Ran(stored=True)`.
    The crash marks stay in `redis`, the main Redis, which does not evict them."""
    cache = cache if cache is not None else redis
    names = [item.cache_key or str(index) for index, item in enumerate(items)]
    marks_key = keys.isolation_key(job_id)
    stored = await mget(cache, [keys.result_key(deployment, item.cache_key or "-") for item in items])
    marks = await redis.hmget(marks_key, names)  # type: ignore[misc]
    out: list[bytes] = []
    for item, name, raw, mark in zip(items, names, stored, marks, strict=True):
        if raw and item.cache_key:
            out.append(bytes(raw))
        elif crashes >= defaults.MAX_CRASHES:
            out.append(_failed(f"the work stopped {crashes} worker processes; it was not run again"))
        elif mark is not None and int(mark) > 0:
            log.error("poison_input", model=deployment, job=job_id, item=name)
            out.append(_failed("this input stopped the worker process when forwarded alone"))
        else:
            out.append(await _solo((redis, cache), marks_key, name, model, executor, item, deployment, ttl_s))
    return out


async def _solo(
    connections: tuple[ArqRedis, ArqRedis],
    marks_key: str,
    name: str,
    model: LoadedModel,
    executor: Executor,
    item: WorkItem,
    deployment: str,
    ttl_s: int,
) -> bytes:
    """Forward `item` alone. The mark goes up once the executor thread has started this forward
    (and nothing else), and down when it ends, so it survives only a crash of this forward.
    `connections`: (the main Redis, the result cache's)."""
    redis, cache = connections
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    go = threading.Event()

    def forward() -> list[np.ndarray]:
        loop.call_soon_threadsafe(started.set)
        go.wait()
        return model.run([item])

    running = loop.run_in_executor(executor, forward)
    try:
        await started.wait()
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(marks_key, name, 1)
            pipe.expire(marks_key, defaults.JOB_TTL_S)
            await pipe.execute()
    finally:
        go.set()
    result: Result
    try:
        arrays = await running
        result = np.asarray(arrays[0], dtype=np.float32)
    except Exception as exc:  # a Python error fails this item, as the coalescer's forward does
        result = ItemError("unavailable", f"the forward failed: {type(exc).__name__}: {exc}")
    encoded = encode_result(result)
    async with cache.pipeline(transaction=False) as pipe:
        write_back(pipe, deployment, [item], [encoded], ttl_s)
        await pipe.execute()
    await redis.hincrby(marks_key, name, -1)  # type: ignore[misc]
    return encoded

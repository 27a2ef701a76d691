"""The device worker: arq pulls jobs, the coalescer batches their items, results go to Redis.

Each deployment has a `DrivenWorker` per queue (interactive and bulk), polled as soon as its
wake channel says a job is queued and at the latest every `poll_delay_s`. A job stores its
results and publishes its reply before it is acknowledged, and is leased while it runs
(`leases.LeaseKeeper`), so a dead worker's jobs run again elsewhere within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import structlog
from arq.connections import ArqRedis
from arq.worker import func

from vllm_srun import defaults, tracing
from vllm_srun.errors import Unavailable
from vllm_srun.plugins.base import ItemError, LoadedModel, Result
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.gateway import write_back
from vllm_srun.queue.jobs import BulkStore
from vllm_srun.queue.redis import (
    REDIS_ERRORS,
    is_cluster,
    lost_connection,
    make_pool,
    publish,
)
from vllm_srun.queue.results import encode_result
from vllm_srun.queue.worker.arq_worker import FINISH, WITHDRAWN, DrivenWorker, Finish
from vllm_srun.queue.worker.chunks import ChunkRunner
from vllm_srun.queue.worker.coalescer import BatchLimits, Coalescer, Outcome
from vllm_srun.queue.worker.heartbeat import HEARTBEAT_S, beat
from vllm_srun.queue.worker.leases import LeaseKeeper, run_isolated
from vllm_srun.queue.worker.poller import WakeablePoller

log = structlog.get_logger("vllm_srun.worker")

# A job that meets a lost Redis tries again after this, doubling up to the maximum.
OUTAGE_RETRY_S = 0.1
OUTAGE_RETRY_MAX_S = 2.0

_T = TypeVar("_T")

# What a withdrawn request's items are answered with (nobody waits for them; never stored).
_CANCELLED = ItemError("cancelled", "the request was withdrawn")



def _wanted(job: protocol.JobPayload, withdrawn: frozenset[str]) -> list[bool]:
    """Per item of `job`: False when its request was withdrawn."""
    wanted: list[bool] = []
    start = 0
    for part in job.split():
        wanted += [part.request_id not in withdrawn] * (part.end - start)
        start = part.end
    return wanted


@dataclass
class Deployment:
    """A loaded model served by this worker, and the executor of the device it runs on."""

    model: LoadedModel
    limits: BatchLimits
    executor: ThreadPoolExecutor

    @property
    def name(self) -> str:
        return self.model.info.name


class DeviceWorker:
    """Serves the given deployments from one Redis until `close`."""

    def __init__(
        self,
        *,
        redis_url: str,
        deployments: Sequence[Deployment],
        stats: Stats,
        max_jobs: int = 1024,
        job_timeout_s: float = defaults.JOB_TIMEOUT_S,
        poll_delay_s: float = 0.5,
        # arq's own bound on runs of a job; crash recovery bounds them first (MAX_CRASHES).
        max_tries: int = defaults.MAX_CRASHES + 4,
        lease_s: float = defaults.LEASE_S,
        lease_renew_s: float = defaults.LEASE_RENEW_S,
        job_ttl_s: int = defaults.JOB_TTL_S,
        result_ttl_s: int = defaults.CACHE_TTL_S,
        # Chunks in flight per deployment: more than one, so the next chunk is planned and looked
        # up while another forwards and the device does not wait between chunks.
        bulk_chunks: int = 3,
        # The result cache's Redis (--cache-redis); None: the main one.
        cache_url: str | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.cache_url = cache_url
        self._cache: ArqRedis | None = None
        self.deployments: dict[str, Deployment] = {d.name: d for d in deployments}
        self.stats = stats
        self.max_jobs = max_jobs
        self.job_timeout_s = job_timeout_s
        self.poll_delay_s = poll_delay_s
        self.max_tries = max_tries
        self.job_ttl_s = job_ttl_s
        self.result_ttl_s = result_ttl_s
        self.bulk_chunks = bulk_chunks
        self.lease_s = lease_s
        self.lease_renew_s = lease_renew_s
        self._leases: LeaseKeeper | None = None
        self._chunks: ChunkRunner | None = None
        self._active: dict[str, list[asyncio.Future[Outcome]]] = {}
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.coalescers: dict[str, Coalescer] = {}
        self._redis: ArqRedis | None = None
        self._workers: list[DrivenWorker] = []
        self._pollers: list[WakeablePoller] = []
        self._closing = False
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def redis(self) -> ArqRedis:
        assert self._redis is not None, "worker not started"
        return self._redis

    async def start(self) -> None:
        """Connect and serve the deployments given so far; `add` serves more later."""
        self._redis = make_pool(self.redis_url)
        self._cache = make_pool(self.cache_url) if self.cache_url else self._redis
        store = BulkStore(self._redis, ttl_s=self.job_ttl_s)
        self._chunks = ChunkRunner(self._redis, store, self.coalescers, self.result_ttl_s, cache=self._cache)
        self._leases = LeaseKeeper(
            self._redis, self._workers, lease_s=self.lease_s, renew_s=self.lease_renew_s
        )
        for deployment in self.deployments.values():
            self._serve(deployment)
        await self._beat()  # apps see the deployments served as soon as this returns
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._heartbeat(), name="worker-heartbeat"))
        self._tasks.append(loop.create_task(self._leases.run(), name="worker-leases"))
        log.info("worker_started", worker=self.worker_id, deployments=sorted(self.deployments))

    async def add(self, deployment: Deployment) -> None:
        """Serve one more deployment (a model that became ready after the worker started);
        apps see it served as soon as this returns."""
        self.deployments[deployment.name] = deployment
        if self._redis is not None:
            self._serve(deployment)
            await self._beat()

    def _serve(self, deployment: Deployment) -> None:
        name = deployment.name
        loop = asyncio.get_running_loop()
        coalescer = Coalescer(
            deployment.model, limits=deployment.limits, executor=deployment.executor, stats=self.stats
        )
        coalescer.start()
        self.coalescers[name] = coalescer
        queues = [
            (
                keys.queue_name(name),
                keys.wake_channel(name),
                keys.RUN_ITEMS,
                self._run_items,
                self.max_jobs,
                keys.cancel_channel(name),
            ),
            (
                keys.bulk_queue_name(name),
                keys.bulk_wake_channel(name),
                keys.RUN_CHUNK,
                self._run_chunk,
                self.bulk_chunks,
                None,
            ),
        ]
        for queue, wake, function, handler, max_jobs, cancel in queues:
            worker = DrivenWorker(
                functions=[func(handler, name=function, max_tries=self.max_tries)],
                queue_name=queue,
                redis_pool=self._redis,
                max_jobs=max_jobs,
                job_timeout=self.job_timeout_s,
                keep_result=0,
                poll_delay=self.poll_delay_s,
                lease_s=self.lease_s,
                wake_channel=wake,
                handle_signals=False,
                job_serializer=protocol.serialize,
                job_deserializer=protocol.deserialize,
                log_results=False,
            )
            poller = WakeablePoller(
                worker,
                wake_channel=wake,
                pubsub_url=self.redis_url,
                cancel_channel=cancel,
                on_cancel=self._cancel,
            )
            self._workers.append(worker)
            self._pollers.append(poller)
            self._tasks.append(loop.create_task(poller.run(), name=f"arq:{queue}"))

    async def close(self) -> None:
        self._closing = True
        for poller in self._pollers:
            poller.stop()
        if self._leases is not None:
            self._leases.stop()
        # The pollers end before the leases are handed back: a poll still in flight could claim
        # jobs after the hand-back, whose leases would then lapse and count as a crash.
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, *REDIS_ERRORS):
                await task
        if self._leases is not None:
            await self._leases.release_all()  # others take this worker's jobs now, not on lapse
        for worker in self._workers:
            for job_task in worker.running():
                job_task.cancel()
        for coalescer in self.coalescers.values():
            await coalescer.close()
        if self._redis is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                for name in self.deployments:
                    await self._redis.zrem(keys.worker_key(name), self.worker_id)
                    await self._redis.hdel(keys.engines_key(name), self.worker_id)  # type: ignore[misc]
            await self._redis.aclose()
            if self._cache is not None and self._cache is not self._redis:
                await self._cache.aclose()
        self._tasks.clear()
        self._workers.clear()
        self._pollers.clear()

    async def _heartbeat(self) -> None:
        failing = False
        while not self._closing:  # see WakeablePoller.stop: a cancellation alone may be lost
            try:
                await self._beat()
                failing = False
            except Exception as exc:  # see WakeablePoller.run: must not end
                if not failing:  # one warning per outage
                    log.warning("heartbeat_failed", error=repr(exc))
                failing = True
            await asyncio.sleep(HEARTBEAT_S)

    async def _beat(self) -> None:
        """Mark this worker live for each deployment it serves (see heartbeat.beat)."""
        await beat(self.redis, self.worker_id, {name: d.model for name, d in self.deployments.items()})

    async def _run_items(self, ctx: dict[str, Any], payload: bytes) -> int:
        """arq job function: run one job's items, store and publish their results."""
        job = protocol.decode_job(payload)
        # A child of the app's queue span: the job joins the trace of the request that made it.
        with tracing.span(
            "job",
            kind="consumer",
            parent=tracing.extract(job.trace),
            deployment=job.deployment,
            items=len(job.items),
            job_id=ctx.get("job_id"),
        ):
            return await self._run_job(ctx, job)

    async def _run_job(self, ctx: dict[str, Any], job: protocol.JobPayload) -> int:
        crashes = self._crashes(ctx)
        deployment = self.deployments.get(job.deployment)
        # Parts withdrawn before this claim (their cancel message went to no one) do not run.
        withdrawn: frozenset[str] = ctx.get(WITHDRAWN) or frozenset()
        if crashes >= defaults.POISON_CRASHES and deployment is not None and self._refusal(job) is None:
            wanted = _wanted(job, withdrawn)
            isolated = iter(
                await run_isolated(
                    self.redis,
                    job_id=ctx["job_id"],
                    deployment=job.deployment,
                    model=deployment.model,
                    executor=deployment.executor,
                    items=[item for item, want in zip(job.items, wanted, strict=True) if want],
                    crashes=crashes,
                    ttl_s=job.ttl_s,
                    cache=self._cache,
                )
            )
            encoded = [next(isolated) if want else encode_result(_CANCELLED) for want in wanted]
            reply = protocol.JobReply(request_id=job.request_id, results=encoded, queue_s=0.0, forward_s=0.0)
        else:
            outcomes = await self._outcomes(job, withdrawn)
            encoded = [encode_result(o.result) for o in outcomes]
            reply = protocol.JobReply(
                request_id=job.request_id,
                results=encoded,
                queue_s=max((o.queue_s for o in outcomes), default=0.0),
                forward_s=max((o.forward_s for o in outcomes), default=0.0),
            )
        finish: Finish | None = ctx.get(FINISH)
        await self._through_outage(partial(self._store_and_reply, job, encoded, reply, finish), ctx)
        return len(job.items)

    async def _store_and_reply(
        self,
        job: protocol.JobPayload,
        encoded: list[bytes],
        reply: protocol.JobReply,
        finish: Finish | None,
    ) -> None:
        # Stored before the reply and before arq acknowledges the job (see gateway.Ran.stored):
        # a pipeline runs its commands in order, so one round trip does all three when the cache
        # is the main Redis.
        # On a cluster the entries are on other masters than the job: a cluster pipeline sends to
        # each master at once, so the results go first, in a round trip of their own.
        cache = self._cache if self._cache is not None else self.redis
        apart = cache is not self.redis or is_cluster(cache)
        if apart:
            async with cache.pipeline(transaction=False) as pipe:
                write_back(pipe, job.deployment, job.items, encoded, job.ttl_s)
                await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            if not apart:
                write_back(pipe, job.deployment, job.items, encoded, job.ttl_s)
            publish(pipe, job.reply_to, protocol.encode(reply), after=keys.queue_name(job.deployment))
            if finish is not None:
                finish.on(pipe)
            await pipe.execute()

    async def _run_chunk(self, ctx: dict[str, Any], payload: bytes) -> int:
        """arq job function: one chunk of a bulk job."""
        assert self._chunks is not None
        chunk = protocol.decode_chunk(payload)
        run = partial(self._chunks.run, chunk, job_id=ctx["job_id"], crashes=self._crashes(ctx))
        with tracing.span(
            "chunk",
            kind="consumer",
            parent=tracing.extract(chunk.trace),
            job_id=chunk.job_id,
            chunk=chunk.index,
            requests=chunk.end - chunk.start,
        ):
            done = await self._through_outage(run, ctx)
        # A free chunk slot: wake the workers now rather than at their next fallback poll; with
        # arq's acknowledgement of this chunk in the same round trip.
        finish: Finish | None = ctx.get(FINISH)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                publish(pipe, keys.bulk_wake_channel(chunk.deployment), b"chunk", after=keys.bulk_queue_name(chunk.deployment))
                if finish is not None:
                    finish.on(pipe)
                await pipe.execute()
        except Exception as exc:
            if not lost_connection(exc):
                raise
            if finish is not None:
                finish.sent = False  # arq's own finish tries again
        return done

    async def _through_outage(self, attempt: Callable[[], Awaitable[_T]], ctx: dict[str, Any]) -> _T:
        """`attempt()`, run again (with backoff) while Redis is unreachable, until it is back.

        A job that failed on a lost Redis would be lost with it: arq would finish it as failed
        once Redis answers again. Every attempt is idempotent (results by SET of the same bytes,
        bulk results by HSETNX), so running one again is safe. The job keeps its lease meanwhile;
        arq's job timeout still bounds it, and a stopping worker gives up at once.
        """
        delay_s = OUTAGE_RETRY_S
        while True:
            try:
                return await attempt()
            except Exception as exc:
                if not isinstance(exc, Unavailable) and not lost_connection(exc):
                    raise
                if self._closing:
                    raise
                log.warning("job_waits_for_redis", job=ctx.get("job_id"), error=str(exc))
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, OUTAGE_RETRY_MAX_S)

    def _crashes(self, ctx: dict[str, Any]) -> int:
        """How many times the job in `ctx` lost its lease before this run (see leases.py)."""
        job_id = ctx.get("job_id", "")
        return max((w.crashes.get(job_id, 0) for w in self._workers), default=0)

    async def _outcomes(self, job: protocol.JobPayload, withdrawn: frozenset[str]) -> list[Outcome]:
        coalescer = self.coalescers.get(job.deployment)
        problem = self._refusal(job)
        if coalescer is None or problem is not None:
            error: Result = ItemError("unavailable", problem or f"no worker serves {job.deployment!r}")
            return [Outcome(error) for _ in job.items]
        # Per item: its future in the coalescer, None for an item of a withdrawn part.
        slots: list[asyncio.Future[Outcome] | None] = []
        parts = job.split()
        start = 0
        for part in parts:  # each request's items keep its own deadline and can be withdrawn
            if part.request_id in withdrawn:
                slots += [None] * (part.end - start)
            else:
                mine = coalescer.submit(
                    job.items[start : part.end],
                    priority=job.priority,
                    enqueued_s=job.enqueued_s,
                    deadline_s=part.deadline_s,
                )
                self._active[part.request_id] = mine
                slots += mine
            start = part.end
        try:
            done = iter(await asyncio.gather(*(s for s in slots if s is not None), return_exceptions=True))
        finally:
            for part in parts:
                self._active.pop(part.request_id, None)
        cancelled = Outcome(_CANCELLED)
        outcomes = [cancelled if slot is None else next(done) for slot in slots]
        return [o if isinstance(o, Outcome) else cancelled for o in outcomes]

    def _cancel(self, request_id: str) -> None:
        """A withdrawn request: its queued items are dropped before they run."""
        for future in self._active.pop(request_id, []):
            future.cancel()

    def _refusal(self, job: protocol.JobPayload) -> str | None:
        deployment = self.deployments.get(job.deployment)
        if deployment is None:
            return f"this worker does not serve {job.deployment!r}"
        if deployment.model.info.numerics != job.numerics:
            return (
                f"the worker's {job.deployment!r} runs {deployment.model.info.numerics} numerics, the app "
                f"planned for {job.numerics}: give both the same --max-speed / --dtype"
            )
        if deployment.model.info.model_sha256 != job.model_sha256:
            return (
                f"the worker's {job.deployment!r} is model {deployment.model.info.model_sha256[:12]}, "
                f"the app planned for {job.model_sha256[:12]}: serve the same package on both"
            )
        return None

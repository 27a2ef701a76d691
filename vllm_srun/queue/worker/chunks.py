"""A worker running one chunk of a bulk job: plan, get results, finish, store.

The chunk's requests are planned (`planning.plan`) and finished with the same LoadedModel an
app uses, so a bulk result is byte for byte the interactive answer. Items get their results
through the same gateway; misses join the coalescer at bulk priority, filling what interactive
work leaves of each batch. A chunk that has killed `POISON_CRASHES` workers runs its misses
one item per forward (`leases.run_isolated`), so a poison input fails alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import structlog
from arq.connections import ArqRedis

from vllm_srun import defaults
from vllm_srun.errors import SrunError, Unavailable
from vllm_srun.plugins.base import LoadedModel, Plan, Result, WorkItem
from vllm_srun.plugins.surfaces import finish, request_type
from vllm_srun.queue import keys
from vllm_srun.queue.gateway import Ran, ResultGateway
from vllm_srun.queue.jobs import (
    CACHED,
    DONE,
    FAILED,
    SKIPPED,
    BulkStore,
    ResultLine,
    error_body,
    result_line,
)
from vllm_srun.queue.planning import KeyIdentity, plan
from vllm_srun.queue.protocol import ChunkPayload
from vllm_srun.queue.redis import REDIS_ERRORS
from vllm_srun.queue.results import encode_result
from vllm_srun.queue.worker.coalescer import BULK, Coalescer
from vllm_srun.queue.worker.leases import run_isolated

log = structlog.get_logger("vllm_srun.bulk")


@dataclass(frozen=True)
class _ChunkJob:
    """What a chunk's misses belong to: its arq job, the deaths it caused, its coalescer."""

    job_id: str
    crashes: int
    coalescer: Coalescer


@dataclass
class _Planned:
    index: int
    custom_id: str
    plan: Plan | None = None
    error: bytes | None = None
    results: list[Result] = field(default_factory=list)
    hits: int = 0


class ChunkRunner:
    """Runs chunks for the deployments of one worker."""

    def __init__(
        self,
        redis: ArqRedis,
        store: BulkStore,
        coalescers: dict[str, Coalescer],
        ttl_s: int,
        *,
        cache: ArqRedis | None = None,
    ) -> None:
        self.redis = redis
        self.store = store
        self.coalescers = coalescers
        # Results through the result cache (`cache`, else the main Redis); the job's own
        # results stay in the main Redis (BulkStore), which does not evict.
        self.gateway = ResultGateway(cache if cache is not None else redis, ttl_s=ttl_s)

    async def run(self, chunk: ChunkPayload, *, job_id: str = "", crashes: int = 0) -> int:
        """Run `chunk` (arq job `job_id`, whose worker died `crashes` times before) and store it."""
        job = await self.store.raw(chunk.job_id)
        if not job:
            return 0  # expired and gone: nothing to store
        indices = list(range(chunk.start, chunk.end))
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(keys.job_requests_key(chunk.job_id), chunk.start, chunk.end - 1)
            pipe.lrange(keys.job_custom_ids_key(chunk.job_id), chunk.start, chunk.end - 1)
            pipe.hmget(keys.job_results_key(chunk.job_id), [str(i) for i in indices])
            requests, custom_ids, stored = await pipe.execute()
        todo = [
            (i, bytes(r), c.decode())
            for i, r, c, s in zip(indices, requests, custom_ids, stored, strict=True)
            if s is None
        ]
        if job["status"] in ("cancelling", "cancelled") or time.time() > float(job["expires_at"]):
            reason = error_body("cancelled", "the job was cancelled or expired before this request ran")
            lines = [ResultLine(i, SKIPPED, result_line(i, cid, reason, error=True)) for i, _, cid in todo]
        else:
            await self.store.mark_running(chunk.job_id)
            try:
                lines = await self._compute(chunk, job, todo, job_id, crashes)
            except (Unavailable, *REDIS_ERRORS):
                raise  # Redis is away, not the requests wrong: the chunk runs again (worker.py)
            except Exception as exc:  # a bug must fail these requests, not stall the job
                log.exception("chunk_failed", job=chunk.job_id, chunk=chunk.index)
                body = error_body("unavailable", f"the forward failed: {type(exc).__name__}: {exc}")
                lines = [ResultLine(i, FAILED, result_line(i, cid, body, error=True)) for i, _, cid in todo]
        await self.store.store_chunk(chunk.job_id, chunk.index, chunk.chunks, lines)
        return len(lines)

    async def _compute(
        self,
        chunk: ChunkPayload,
        job: dict[str, str],
        todo: Sequence[tuple[int, bytes, str]],
        job_id: str,
        crashes: int,
    ) -> list[ResultLine]:
        coalescer = self.coalescers.get(chunk.deployment)
        if coalescer is None:
            body = error_body("unavailable", f"this worker does not serve {chunk.deployment!r}")
            return [ResultLine(i, FAILED, result_line(i, cid, body, error=True)) for i, _, cid in todo]
        model = coalescer.model
        planned = await asyncio.to_thread(_plan_all, model, chunk.surface, todo)
        items = [item for p in planned if p.plan for item in p.plan.items]
        # The job's caller's salt (keys.cache_salt), so its chunks share only that caller's cache.
        identity = KeyIdentity(model.info.model_sha256, model.info.numerics, job.get("cache_salt", ""))
        run = _ChunkJob(job_id or chunk.job_id, crashes, coalescer)
        got = await self.gateway.resolve(chunk.deployment, items, self, run, identity=identity)
        position = 0
        for p in planned:
            if p.plan is None:
                continue
            for _ in p.plan.items:
                p.results.append(got.results[position])
                p.hits += got.cached[position]
                position += 1
        return await asyncio.to_thread(_finish_all, model, planned)

    async def run_misses(self, deployment: str, misses: list[WorkItem], job: _ChunkJob) -> Ran:
        """A chunk's misses, at bulk priority (`gateway.MissRunner`); one per forward once the
        chunk has killed POISON_CRASHES workers."""
        if job.crashes >= defaults.POISON_CRASHES:
            isolated = await run_isolated(
                self.redis,
                job_id=job.job_id,
                deployment=deployment,
                model=job.coalescer.model,
                executor=job.coalescer.executor,
                items=misses,
                crashes=job.crashes,
                ttl_s=self.gateway.ttl_s,
                cache=self.gateway.cache,
            )
            return Ran(list(isolated), stored=True)
        outcomes = await asyncio.gather(*job.coalescer.submit(misses, priority=BULK))
        return Ran([encode_result(o.result) for o in outcomes])


def _plan_all(model: LoadedModel, surface: str, todo: Sequence[tuple[int, bytes, str]]) -> list[_Planned]:
    kind = request_type(surface)
    out = []
    for index, raw, custom_id in todo:
        entry = _Planned(index, custom_id)
        try:
            request = msgspec.json.decode(raw, type=kind, strict=False)
            entry.plan = plan(model, surface, request)
        except SrunError as exc:
            entry.error = error_body(exc.code, exc.message)
        except msgspec.ValidationError as exc:
            entry.error = error_body("invalid_request", str(exc))
        out.append(entry)
    return out


def _finish_all(model: LoadedModel, planned: Sequence[_Planned]) -> list[ResultLine]:
    lines = []
    for p in planned:
        if p.plan is None:
            assert p.error is not None
            lines.append(ResultLine(p.index, FAILED, result_line(p.index, p.custom_id, p.error, error=True)))
            continue
        try:
            body = msgspec.json.encode(finish(model, p.plan, p.results))
        except SrunError as exc:
            error = error_body(exc.code, exc.message)
            lines.append(ResultLine(p.index, FAILED, result_line(p.index, p.custom_id, error, error=True)))
            continue
        kind = CACHED if p.plan.items and p.hits == len(p.plan.items) else DONE
        lines.append(ResultLine(p.index, kind, result_line(p.index, p.custom_id, body)))
    return lines

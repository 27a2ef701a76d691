"""`BulkStore`: bulk jobs in Redis, shared by every app replica and worker.

A job is written whole or not at all, and admitted only within its `BulkQuotas` (else 429
naming the limit). Chunk results are stored once per index however often a chunk runs, and
counted and streamed once. A job made with an API key is its `owner`'s: read with another
owner it does not exist (JobNotFound), and its Idempotency-Key is that caller's alone.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from string import Template
from typing import Any

from arq.connections import ArqRedis
from redis.exceptions import ResponseError

from vllm_srun import defaults, tracing
from vllm_srun.errors import IdempotencyKeyReused, Overloaded, Unavailable
from vllm_srun.queue import keys, protocol, scripts
from vllm_srun.queue.arq_compat import add_job
from vllm_srun.queue.jobs.events import EventReader
from vllm_srun.queue.jobs.records import (
    CACHED,
    FAILED,
    HSET_BATCH,
    SKIPPED,
    TERMINAL,
    BulkQuotas,
    JobStatus,
    ResultLine,
    head_length,
    job_fields,
    redis_unavailable,
    result_line,
    status_of,
)
from vllm_srun.queue.protocol import ChunkPayload
from vllm_srun.queue.redis import (
    BLOCKING_READ_S,
    REDIS_ERRORS,
    is_cluster,
    pipeline,
    publish,
    run_script,
    wait_replica,
)

# Job data outlives the job's TTL by this much, so a reader sees "expired" rather than 404.
_TOMBSTONE_S = 3600
# An Idempotency-Key names its job from before the job's transaction is sent (a large body
# takes a while to write): for this long, a key whose job is not there yet is being created,
# not lost, and a retry is told to wait instead of making a second job.
_CREATING_S = 120.0
_APPEND_BATCH = 1000
# Jobs whose data expired, forgotten by the accounting per admission at most: bounded work.
_PURGE_BATCH = 100
# Results read per Redis round trip by `results`.
RESULTS_SLICE = 256

# Scripts (queue/lua/): the quotas' accounting across jobs, a job's status moves, an
# Idempotency-Key taken over, and a chunk's results stored (its placeholders filled in here).
_ADMIT = scripts.load("jobs_admit")
_RELEASE = scripts.load("jobs_release")
_MOVE_STATUS = scripts.load("job_move_status")
_TAKE_OVER = scripts.load("job_take_over")
_STORE_CHUNK = Template(scripts.load("job_store_chunk")).substitute(
    failed=FAILED, cached=CACHED, skipped=SKIPPED, hset_batch=HSET_BATCH
)


class BulkStore:
    """Job state in Redis, shared by every app replica and worker."""

    def __init__(
        self,
        redis: ArqRedis,
        *,
        ttl_s: int = defaults.JOB_TTL_S,
        chunk_size: int = defaults.BULK_CHUNK_SIZE,
        quotas: BulkQuotas | None = None,
        streams: ArqRedis | None = None,
        event_batch_bytes: int = defaults.EVENT_BATCH_BYTES,
    ) -> None:
        self.redis = redis
        self.streams = streams if streams is not None else redis
        self.event_batch_bytes = event_batch_bytes
        self._events = EventReader(self.streams, event_batch_bytes=event_batch_bytes)
        self.ttl_s = ttl_s
        self.chunk_size = chunk_size
        self.quotas = quotas or BulkQuotas()
        self._admit = redis.register_script(_ADMIT)
        self._release = redis.register_script(_RELEASE)
        self._store_chunk = redis.register_script(_STORE_CHUNK)
        self._move_status = redis.register_script(_MOVE_STATUS)
        self._take_over = redis.register_script(_TAKE_OVER)

    async def close(self) -> None:
        """Close the streams' own client (the main one is its owner's)."""
        if self.streams is not self.redis:
            await self.streams.aclose()

    def end_streams(self) -> None:
        """End every `events` stream at once, without a final status: this process is stopping,
        and a client resumes from its Last-Event-ID on another replica. An open stream would
        otherwise hold the stop for the whole grace period."""
        self._events.end()

    @redis_unavailable
    async def create(
        self,
        *,
        deployment: str,
        surface: str,
        requests: Sequence[bytes],
        custom_ids: Sequence[str],
        errors: dict[int, bytes],
        idempotency_key: str | None = None,
        request_digest: str = "",
        owner: str = "",
        cache_salt: str = "",
    ) -> tuple[JobStatus, bool]:
        """A new job (or, for a known Idempotency-Key, the job it made); True when new.

        The job is written whole or not at all (one transaction: its state, its requests, the
        results of requests refused up front and its chunks on the queue), so a Redis that
        dies meanwhile leaves no job that would never run. A key whose job is gone (written in
        the second an append-only Redis lost to a crash) makes a new one; a key whose job is
        still being written is Unavailable (retry), so two uploads with one key make one job.
        A key is bound to `request_digest` (a hash of the request that made its job): sent with
        another request it is IdempotencyKeyReused (422), never that job. `owner` (a caller id,
        "" without API keys) scopes the key and owns the job; `cache_salt` is its chunks'."""
        job_id = "job_" + uuid.uuid4().hex
        now = time.time()
        idem = keys.idempotency_key(deployment, idempotency_key, owner) if idempotency_key else None
        claim = f"{job_id} {now} {request_digest}".rstrip()
        if idem is not None and not await self.redis.set(idem, claim, nx=True, ex=self.ttl_s):
            existing = await self.redis.get(idem)
            if existing is not None:
                existing_id, made, bound = [*existing.decode().split(" "), "", ""][:3]
                if bound and bound != request_digest:  # a claim from before the binding has none
                    raise IdempotencyKeyReused(
                        "Idempotency-Key: already used for a different request; send a new key"
                    )
                if await self.raw(existing_id):
                    return await self.get(existing_id, owner=owner), False
                if now - float(made or 0) < _CREATING_S:
                    raise Unavailable(
                        "Idempotency-Key: the job of this key is still being created; retry",
                        headers={"Retry-After": "1"},
                    )
            taken = await self._take_over(keys=[idem], args=[existing or b"", claim, self.ttl_s])
            if not taken:
                raise Unavailable(
                    "Idempotency-Key: another request is creating this key's job; retry",
                    headers={"Retry-After": "1"},
                )
        chunks = [
            (i, s, min(s + self.chunk_size, len(requests)))
            for i, s in enumerate(range(0, len(requests), self.chunk_size))
        ]
        keep_s = self.ttl_s + _TOMBSTONE_S
        try:
            await self.admit(job_id, len(requests), keep_until=now + keep_s)
        except Overloaded:
            if idem is not None:
                with contextlib.suppress(*REDIS_ERRORS):
                    await self.redis.delete(idem)
            raise
        try:
            async with pipeline(self.redis, transaction=True) as pipe:
                pipe.hset(
                    keys.job_key(job_id),
                    mapping={
                        "surface": surface,
                        "model": deployment,
                        "status": "queued",
                        "total": len(requests),
                        "done": 0,
                        "failed": 0,
                        "cached": 0,
                        "created_at": now,
                        "expires_at": now + self.ttl_s,
                        "chunks": len(chunks),
                        "max_result_bytes": self.quotas.max_job_result_bytes,
                        "max_stored_bytes": self.quotas.max_stored_result_bytes,
                        **({"owner": owner} if owner else {}),
                        **({"cache_salt": cache_salt} if cache_salt else {}),
                    },
                )
                for start in range(0, len(requests), _APPEND_BATCH):
                    pipe.rpush(keys.job_requests_key(job_id), *requests[start : start + _APPEND_BATCH])
                    pipe.rpush(keys.job_custom_ids_key(job_id), *custom_ids[start : start + _APPEND_BATCH])
                for key in (
                    keys.job_key(job_id),
                    keys.job_requests_key(job_id),
                    keys.job_custom_ids_key(job_id),
                ):
                    pipe.expire(key, keep_s)
                # Before any chunk can run, so a chunk that finishes the job counts them.
                _write_errors(
                    pipe,
                    job_id,
                    [
                        ResultLine(i, FAILED, result_line(i, custom_ids[i], body, error=True))
                        for i, body in errors.items()
                    ],
                )
                if is_cluster(self.redis):
                    # The records (one slot) before the chunks (the model's): a chunk that ran
                    # before them would find no job. No MULTI spans both slots.
                    wait_replica(pipe, self.redis, keys.job_key(job_id))
                    await pipe.execute()
                trace = tracing.inject()  # each chunk's span joins the creating request's trace
                for index, start, end in chunks:
                    payload = protocol.encode(
                        ChunkPayload(job_id, deployment, surface, index, start, end, len(chunks), trace)
                    )
                    add_job(
                        pipe,
                        queue=keys.bulk_queue_name(deployment),
                        function=keys.RUN_CHUNK,
                        payload=payload,
                        expires_s=self.ttl_s,
                    )
                publish(pipe, keys.bulk_wake_channel(deployment), b"bulk", after=keys.bulk_queue_name(deployment))
                wait_replica(pipe, self.redis, keys.bulk_queue_name(deployment))
                await pipe.execute()
        except (*REDIS_ERRORS, ResponseError):
            with contextlib.suppress(*REDIS_ERRORS, ResponseError):
                await self._release(keys=_ACCOUNTING, args=[job_id])
            if is_cluster(self.redis):  # no MULTI there: drop what was written (one slot)
                with contextlib.suppress(*REDIS_ERRORS, ResponseError):
                    await self.redis.delete(*_job_keys(job_id))
            if idem is not None:  # the key must not name a job that was never written
                with contextlib.suppress(*REDIS_ERRORS):
                    await self.redis.delete(idem)
            raise
        if not chunks:
            await self.store_chunk(job_id, 0, 1, [])
        return await self.get(job_id, owner=owner), True

    async def admit(self, job_id: str, items: int, *, keep_until: float) -> None:
        """Count a job of `items` in (job_id "" only checks), or Overloaded naming the quota."""
        quotas = self.quotas
        args: list[Any] = [time.time(), _PURGE_BATCH, job_id, items, keep_until]
        refused, total = await self._admit(
            keys=_ACCOUNTING, args=[*args, quotas.max_queued_items, quotas.max_stored_result_bytes]
        )
        if refused == 1:
            raise Overloaded(
                f"requests: {items} more would pass the {quotas.max_queued_items} items queued for "
                f"all jobs (--max-queued-job-items; {total} are queued now): retry later",
                headers={"Retry-After": "30"},
            )
        if refused == 2:
            raise Overloaded(
                f"jobs hold {total} bytes of results, at most {quotas.max_stored_result_bytes} "
                "(--max-stored-result-bytes): retry once older jobs expire",
                headers={"Retry-After": "60"},
            )

    @redis_unavailable
    async def store_chunk(self, job_id: str, chunk: int, chunks: int, lines: Sequence[ResultLine]) -> None:
        argv: list[Any] = [chunk, chunks, time.time(), self.ttl_s + _TOMBSTONE_S, job_id]
        for line in lines:
            argv += [line.index, line.kind, line.line, head_length(line.line)]
        job_keys = [
            keys.job_results_key(job_id),
            keys.job_key(job_id),
            keys.job_events_key(job_id),
            keys.job_chunks_key(job_id),
            *_ACCOUNTING[1:],
        ]
        if not is_cluster(self.redis):
            await self._store_chunk(keys=job_keys, args=argv)
            return
        # Replicated before the chunk is acknowledged (on the model's slot): see wait_replica.
        async with self.redis.pipeline(transaction=False) as pipe:
            await run_script(pipe, _STORE_CHUNK, job_keys, argv)
            wait_replica(pipe, self.redis, job_keys[0])
            await pipe.execute()

    async def raw(self, job_id: str, client: ArqRedis | None = None) -> dict[str, str]:
        """The job's fields, whoever owns it ({} for none): for workers, never for a caller."""
        return await job_fields(client if client is not None else self.redis, job_id)

    async def get(
        self, job_id: str, *, owner: str | None = None, client: ArqRedis | None = None
    ) -> JobStatus:
        """The job's status; JobNotFound if there is none, or `owner` (a caller id; None: any
        caller, a server without API keys) did not make it. Another caller's job reads exactly
        as a job that does not exist."""
        return status_of(job_id, await self.raw(job_id, client), owner)

    @redis_unavailable
    async def mark_running(self, job_id: str) -> None:
        await self.redis.hsetnx(keys.job_key(job_id), "started_at", str(time.time()))  # type: ignore[misc]
        await self._move_status([keys.job_key(job_id)], ["running", "queued"])

    @redis_unavailable
    async def cancel(self, job_id: str, *, owner: str | None = None) -> JobStatus:
        job = await self.get(job_id, owner=owner)
        if job.status in TERMINAL:  # "expired" is only computed, never stored
            return job
        await self._move_status([keys.job_key(job_id)], ["cancelling", "queued", "running"])
        return await self.get(job_id, owner=owner)

    @redis_unavailable
    async def results(
        self,
        job_id: str,
        offset: int,
        limit: int,
        *,
        owner: str | None = None,
        max_bytes: int | None = None,
    ) -> list[bytes]:
        """Result lines in input order from `offset`; stops at the first one not yet stored,
        and (with `max_bytes`) once the lines read reach that many bytes (at least one line).
        Read in slices of RESULTS_SLICE, so a page never fetches more than it returns by
        much more than one slice."""
        job = await self.get(job_id, owner=owner)
        end = min(offset + limit, job.counts.total)
        out: list[bytes] = []
        size = 0
        for start in range(offset, end, RESULTS_SLICE):
            indices = [str(i) for i in range(start, min(start + RESULTS_SLICE, end))]
            stored = await self.redis.hmget(keys.job_results_key(job_id), indices)  # type: ignore[misc]
            for raw in stored:
                if raw is None or (max_bytes is not None and out and size + len(raw) > max_bytes):
                    return out
                out.append(bytes(raw))
                size += len(raw)
        return out

    def events(
        self, job_id: str, last_id: str = "0-0", block_ms: int = int(BLOCKING_READ_S * 1000), *, owner: str | None = None
    ) -> AsyncIterator[tuple[str, str, bytes]]:
        """(event id, event name, data) from after `last_id`, until the job's final status; an
        empty event name is a keep-alive. Reads go through `streams`; between yields at most
        `event_batch_bytes` of result lines (or one line) are held."""
        return self._events.read(job_id, last_id, block_ms, owner=owner)


def _job_keys(job_id: str) -> list[str]:
    """Every key of one job's records (they share the bulk state's slot)."""
    return [
        keys.job_key(job_id),
        keys.job_requests_key(job_id),
        keys.job_custom_ids_key(job_id),
        keys.job_results_key(job_id),
        keys.job_chunks_key(job_id),
        keys.job_events_key(job_id),
    ]


def _write_errors(pipe: Any, job_id: str, lines: Sequence[ResultLine]) -> None:
    """Queue on `pipe` the results of requests refused before the job ran, counted as failed."""
    for line in lines:
        pipe.hsetnx(keys.job_results_key(job_id), str(line.index), line.line)
        pipe.hincrby(keys.job_key(job_id), "failed", 1)
        pipe.xadd(keys.job_events_key(job_id), {"event": "result", "index": str(line.index)})


_ACCOUNTING: list[str] = [
    keys.jobs_live_key(),
    keys.jobs_items_key(),
    keys.jobs_bytes_key(),
    keys.jobs_totals_key(),
]

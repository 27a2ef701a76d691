"""Bulk jobs in Redis: creation, status, results in input order, events, cancellation.

A job is a list of surface requests split into chunks; each chunk is an arq job on the
deployment's bulk queue, run by whichever worker takes it. Everything about a job lives in
Redis under `job:{id}` with a TTL, so any app replica can read or stream it, whichever replica
created it and whether or not that replica still runs.

A chunk stores its results with one Lua script: a result is written only if its index has
none yet (one HMGET finds which, one HSET writes them), and only then counted and streamed. A
chunk retried after a worker died therefore never counts or streams an item twice.

The state Redis never evicts, so what jobs may hold in it is bounded (`BulkQuotas`): a job is
admitted only while the items of every live job not yet stored, plus its own, stay within
`max_queued_items`, and the result bytes stored stay under `max_stored_result_bytes` (else 429
naming the limit). A result that would take its job past `max_job_result_bytes`, or all jobs
past `max_stored_result_bytes`, is stored as that item's `result_too_large` error instead, so
a job that produces more than expected still ends, and Redis stays under its maxmemory.

A job made with an API key names its caller (`owner`, a `keys.caller_id`, never the key): read
with another owner it does not exist (JobNotFound), whatever is asked of it. Its Idempotency-Key
is that caller's alone, and its chunks plan with the caller's cache salt (`cache_salt`).

Event streams read on a client of their own (`streams`, a bounded blocking pool), so however
many are open they cannot take the connections of the request path; one read holds at most
`event_batch_bytes` of result lines, whatever a reader's pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import wraps
from string import Template
from typing import Any, ParamSpec, TypeVar

import msgspec
from arq.connections import ArqRedis
from redis.exceptions import ResponseError

from vllm_srun import defaults, tracing
from vllm_srun.errors import IdempotencyKeyReused, JobNotFound, Overloaded, Unavailable
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.arq_compat import add_job
from vllm_srun.queue.protocol import ChunkPayload
from vllm_srun.queue.redis import (
    REDIS_ERRORS,
    is_cluster,
    out_of_memory,
    pipeline,
    publish,
    run_script,
    state_full,
    wait_replica,
)

TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# What `create` hands out. Anything else names no job: checked before a key is built from it,
# so a crafted id ("job_…:results") cannot reach another key of the job.
JOB_ID = re.compile(r"job_[0-9a-f]{32}")
# Result kinds, as stored and as the chunk script counts them: done, failed, done from the
# cache, skipped because the job was cancelled. Defined here only; `_STORE_CHUNK` is filled in.
DONE, FAILED, CACHED, SKIPPED = "d", "f", "c", "x"
# Job data outlives the job's TTL by this much, so a reader sees "expired" rather than 404.
_TOMBSTONE_S = 3600
# An Idempotency-Key names its job from before the job's transaction is sent (a large body
# takes a while to write): for this long, a key whose job is not there yet is being created,
# not lost, and a retry is told to wait instead of making a second job.
_CREATING_S = 120.0
# Takes an Idempotency-Key over for a new job only if it still names the lost one: of two
# requests that find the same job lost, one creates the replacement.
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""
_APPEND_BATCH = 1000
# Lines one HMGET or HSET of the chunk script reads or stores (Lua's unpack has a stack limit).
_HSET_BATCH = 500
# Events one XREAD of a stream takes: each is small (an index, or a progress count).
_EVENTS_PER_READ = 200
# The stored result lines of `ARGV[3..]` (false where none), in order, until they would pass
# ARGV[1] bytes (at least one line; lines past ARGV[2] are not read): a stream's read is
# bounded in bytes, however large the lines.
_LINES_WITHIN = """
local out, total, cap = {}, 0, tonumber(ARGV[1])
for i = 3, math.min(#ARGV, 2 + tonumber(ARGV[2])) do
  local line = redis.call('HGET', KEYS[1], ARGV[i])
  local size = line and #line or 4
  if i > 3 and total + size > cap then break end
  total = total + size
  out[#out + 1] = line
end
return out
"""
# Jobs whose data expired, forgotten by the accounting per admission at most: bounded work.
_PURGE_BATCH = 100


# Results read per Redis round trip by `results`.
RESULTS_SLICE = 256


@dataclass(frozen=True, kw_only=True)
class BulkQuotas:
    """What bulk jobs may hold in the state Redis (docs/deployment.md, sizing the state Redis).
    The per-job request count is `--max-job-requests`, checked before validation."""

    # Items of all live jobs not yet stored (queued or running), across every model.
    max_queued_items: int = 2_000_000
    # Result bytes one job may store, and all live jobs together.
    max_job_result_bytes: int = 256 * 1024 * 1024
    max_stored_result_bytes: int = 384 * 1024 * 1024


# Forgets the jobs whose data expired (at most ARGV[2] of them), then admits one of ARGV[3]
# items if the totals allow: 0, or 1 (items) / 2 (bytes) with the total that refused it.
_ADMIT = """
local live, items, bytes, totals = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, purge = tonumber(ARGV[1]), tonumber(ARGV[2])
local job, n, keep_until = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local max_items, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', live, '-inf', now, 'LIMIT', 0, purge)) do
  redis.call('HINCRBY', totals, 'items', 0 - tonumber(redis.call('HGET', items, old) or '0'))
  redis.call('HINCRBY', totals, 'bytes', 0 - tonumber(redis.call('HGET', bytes, old) or '0'))
  redis.call('HDEL', items, old)
  redis.call('HDEL', bytes, old)
  redis.call('ZREM', live, old)
end
local t = redis.call('HMGET', totals, 'items', 'bytes')
local queued, stored = tonumber(t[1] or '0'), tonumber(t[2] or '0')
if n > 0 and queued + n > max_items then return {1, queued} end
if stored >= max_bytes then return {2, stored} end
if job == '' then return {0, 0} end
redis.call('ZADD', live, keep_until, job)
redis.call('HSET', items, job, n)
redis.call('HSET', bytes, job, 0)
redis.call('HINCRBY', totals, 'items', n)
return {0, 0}
"""
# Takes one job out of the accounting (its creation failed).
_RELEASE = """
local live, items, bytes, totals, job = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
redis.call('HINCRBY', totals, 'items', 0 - tonumber(redis.call('HGET', items, job) or '0'))
redis.call('HINCRBY', totals, 'bytes', 0 - tonumber(redis.call('HGET', bytes, job) or '0'))
redis.call('HDEL', items, job)
redis.call('HDEL', bytes, job)
redis.call('ZREM', live, job)
return 1
"""


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _redis_unavailable(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """A lost Redis is `Unavailable` (503, retry), never a bug: a job lives in Redis, so it is
    neither gone nor failed while Redis restarts."""

    @wraps(method)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await method(*args, **kwargs)
        except REDIS_ERRORS as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc
        except ResponseError as exc:
            if not out_of_memory(exc):
                raise
            raise state_full() from exc

    return call


class JobCounts(msgspec.Struct):
    total: int
    done: int
    failed: int
    cached: int


class JobStatus(msgspec.Struct, omit_defaults=True):
    id: str
    status: str
    surface: str
    model: str
    counts: JobCounts
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    object: str = msgspec.field(default_factory=lambda: "job")


@dataclass(frozen=True)
class ResultLine:
    """One request's outcome as stored: its index, kind (DONE/FAILED/CACHED) and JSON line."""

    index: int
    kind: str
    line: bytes


def result_line(index: int, custom_id: str, body: bytes, *, error: bool = False) -> bytes:
    """`{"index", "custom_id", "response"|"error"}` with `body` (already JSON) inside verbatim."""
    field = b"error" if error else b"response"
    cid = msgspec.json.encode(custom_id or None)
    return b'{"index":%d,"custom_id":%s,"%s":%s}' % (index, cid, field, body)


def error_body(code: str, message: str) -> bytes:
    return msgspec.json.encode({"code": code, "message": message})


_STORE_CHUNK = Template("""
local FAILED, CACHED, SKIPPED = '$failed', '$cached', '$skipped'
local results, job, events, chunks = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local items, bytes, totals = KEYS[5], KEYS[6], KEYS[7]
local chunk, n_chunks, now, ttl, id = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
-- Jobs made before the quotas existed carry no limits and are not accounted.
local limits = redis.call('HMGET', job, 'max_result_bytes', 'max_stored_bytes')
local job_max, all_max = tonumber(limits[1]), tonumber(limits[2])
local accounted = redis.call('HEXISTS', items, id) == 1
-- The byte counts are read once and kept here, and every counter is written once per chunk.
-- Which lines are stored already is read once too (a line already stored is neither stored,
-- counted, limited nor streamed again); the new lines go in one HSET, and one `results` event
-- names them all.
local used, all = 0, 0
if job_max then
  used = tonumber(redis.call('HGET', bytes, id) or '0')
  all = tonumber(redis.call('HGET', totals, 'bytes') or '0')
end
local fields = {}
for i = 6, #ARGV, 4 do fields[#fields + 1] = ARGV[i] end
local had = {}
for i = 1, #fields, $hset_batch do
  local got = redis.call('HMGET', results, unpack(fields, i, math.min(#fields, i + $hset_batch - 1)))
  for j = 1, #got do had[i + j - 1] = got[j] end
end
local n_stored, n_bytes, n_done, n_failed, n_cached, n_skipped = 0, 0, 0, 0, 0, 0
local new, stored = {}, {}
for i = 6, #ARGV, 4 do
  local line, kind = ARGV[i + 2], ARGV[i + 1]
  if had[(i - 2) / 4] then line = nil end
  if line then
    if job_max then
      local limit = nil
      if used + #line > job_max then limit = job_max .. ' bytes of results per job (--max-job-result-bytes)'
      elseif all + #line > all_max then limit = all_max .. ' bytes of results of all jobs (--max-stored-result-bytes)' end
      if limit then
        line = string.sub(line, 1, tonumber(ARGV[i + 3])) .. ',"error":{"code":"result_too_large",'
          .. '"message":"result not stored: it would pass ' .. limit .. '"}}'
        kind = FAILED
      end
    end
    new[#new + 1] = ARGV[i]
    new[#new + 1] = line
    stored[#stored + 1] = ARGV[i]
    n_stored, n_bytes = n_stored + 1, n_bytes + #line
    used, all = used + #line, all + #line
    if kind == FAILED or kind == SKIPPED then n_failed = n_failed + 1 else n_done = n_done + 1 end
    if kind == CACHED then n_cached = n_cached + 1 end
    if kind == SKIPPED then n_skipped = n_skipped + 1 end
  end
end
for i = 1, #new, 2 * $hset_batch do
  redis.call('HSET', results, unpack(new, i, math.min(#new, i + 2 * $hset_batch - 1)))
end
if n_stored > 0 then
  -- One entry for the lines stored here, with an id that leaves a sequence number below it for
  -- each of them: the line k of n is event ms-(seq-n+1+k) to a reader (`_expand`), so a reader
  -- resumes after any one line. Above the stream's last id, whatever the clocks say.
  local ms, seq = math.floor(tonumber(now) * 1000), n_stored - 1
  local last = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)
  if #last > 0 then
    local last_ms, last_seq = string.match(last[1][1], '^(%d+)-(%d+)$$')
    last_ms, last_seq = tonumber(last_ms), tonumber(last_seq)
    if ms <= last_ms then ms, seq = last_ms, last_seq + n_stored end
  end
  redis.call('XADD', events, string.format('%.0f-%.0f', ms, seq), 'event', 'results',
             'indices', table.concat(stored, ','))
end
if accounted and n_stored > 0 then
  redis.call('HINCRBY', items, id, -n_stored)
  redis.call('HINCRBY', bytes, id, n_bytes)
  redis.call('HINCRBY', totals, 'items', -n_stored)
  redis.call('HINCRBY', totals, 'bytes', n_bytes)
end
if n_done > 0 then redis.call('HINCRBY', job, 'done', n_done) end
if n_failed > 0 then redis.call('HINCRBY', job, 'failed', n_failed) end
if n_cached > 0 then redis.call('HINCRBY', job, 'cached', n_cached) end
if n_skipped > 0 then redis.call('HINCRBY', job, 'skipped', n_skipped) end
redis.call('SADD', chunks, chunk)
local c = redis.call('HMGET', job, 'total', 'done', 'failed', 'cached', 'status', 'skipped')
local progress = cjson.encode({total = tonumber(c[1]), done = tonumber(c[2]), failed = tonumber(c[3]),
                               cached = tonumber(c[4])})
redis.call('XADD', events, '*', 'event', 'progress', 'data', progress)
local status = c[5]
if redis.call('SCARD', chunks) >= n_chunks and status ~= 'completed' and status ~= 'failed'
   and status ~= 'cancelled' then
  local final = 'completed'
  -- A cancel that came after every chunk had started skipped nothing: the job completed.
  if status == 'cancelling' and tonumber(c[6] or '0') > 0 then final = 'cancelled'
  elseif tonumber(c[3]) == tonumber(c[1]) and tonumber(c[1]) > 0 then final = 'failed' end
  redis.call('HSET', job, 'status', final, 'finished_at', now)
  redis.call('XADD', events, '*', 'event', 'status', 'data', cjson.encode({status = final}))
  if accounted then  -- nothing of it is queued any more
    redis.call('HINCRBY', totals, 'items', 0 - tonumber(redis.call('HGET', items, id) or '0'))
    redis.call('HSET', items, id, 0)
  end
end
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
return 1
""").substitute(failed=FAILED, cached=CACHED, skipped=SKIPPED, hset_batch=_HSET_BATCH)


# Moves a job to ARGV[1] only from one of the statuses ARGV[2..]: a cancel never overwrites a
# final status, and a chunk starting never overwrites a cancel.
_MOVE_STATUS = """
local status = redis.call('HGET', KEYS[1], 'status')
for i = 2, #ARGV do
  if status == ARGV[i] then
    redis.call('HSET', KEYS[1], 'status', ARGV[1])
    return 1
  end
end
return 0
"""


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
        self._lines_within = self.streams.register_script(_LINES_WITHIN)
        self.ttl_s = ttl_s
        self.chunk_size = chunk_size
        self.quotas = quotas or BulkQuotas()
        self._admit = redis.register_script(_ADMIT)
        self._release = redis.register_script(_RELEASE)
        self._store_chunk = redis.register_script(_STORE_CHUNK)
        self._move_status = redis.register_script(_MOVE_STATUS)
        self._take_over = redis.register_script(_TAKE_OVER)
        self._streams_ended = asyncio.Event()

    async def close(self) -> None:
        """Close the streams' own client (the main one is its owner's)."""
        if self.streams is not self.redis:
            await self.streams.aclose()

    def end_streams(self) -> None:
        """End every `events` stream at once, without a final status: this process is stopping,
        and a client resumes from its Last-Event-ID on another replica. An open stream would
        otherwise hold the stop for the whole grace period."""
        self._streams_ended.set()

    @_redis_unavailable
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

    @_redis_unavailable
    async def store_chunk(self, job_id: str, chunk: int, chunks: int, lines: Sequence[ResultLine]) -> None:
        argv: list[Any] = [chunk, chunks, time.time(), self.ttl_s + _TOMBSTONE_S, job_id]
        for line in lines:
            argv += [line.index, line.kind, line.line, _head_length(line.line)]
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

    @_redis_unavailable
    async def raw(self, job_id: str, client: ArqRedis | None = None) -> dict[str, str]:
        """The job's fields, whoever owns it ({} for none): for workers, never for a caller."""
        if not JOB_ID.fullmatch(job_id):
            return {}
        redis = client if client is not None else self.redis
        fields: dict[bytes, bytes] = await redis.hgetall(keys.job_key(job_id))  # type: ignore[misc]
        return {k.decode(): v.decode() for k, v in fields.items()}

    async def get(
        self, job_id: str, *, owner: str | None = None, client: ArqRedis | None = None
    ) -> JobStatus:
        """The job's status; JobNotFound if there is none, or `owner` (a caller id; None: any
        caller, a server without API keys) did not make it. Another caller's job reads exactly
        as a job that does not exist."""
        fields = await self.raw(job_id, client)
        if fields and owner is not None and fields.get("owner", "") != owner:
            fields = {}
        if not fields:
            shown = job_id if len(job_id) <= 64 else job_id[:64] + "…"
            raise JobNotFound(f"job {shown!r} does not exist (or its data has expired)")
        status = fields["status"]
        expires_at = float(fields["expires_at"])
        if status not in TERMINAL and time.time() > expires_at:
            status = "expired"
        return JobStatus(
            id=job_id,
            status=status,
            surface=fields["surface"],
            model=fields["model"],
            counts=JobCounts(*(int(fields[k]) for k in ("total", "done", "failed", "cached"))),
            created_at=float(fields["created_at"]),
            started_at=_optional_float(fields, "started_at"),
            finished_at=_optional_float(fields, "finished_at"),
            expires_at=expires_at,
        )

    @_redis_unavailable
    async def mark_running(self, job_id: str) -> None:
        await self.redis.hsetnx(keys.job_key(job_id), "started_at", str(time.time()))  # type: ignore[misc]
        await self._move_status([keys.job_key(job_id)], ["running", "queued"])

    @_redis_unavailable
    async def cancel(self, job_id: str, *, owner: str | None = None) -> JobStatus:
        job = await self.get(job_id, owner=owner)
        if job.status in TERMINAL:  # "expired" is only computed, never stored
            return job
        await self._move_status([keys.job_key(job_id)], ["cancelling", "queued", "running"])
        return await self.get(job_id, owner=owner)

    @_redis_unavailable
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

    async def events(
        self, job_id: str, last_id: str = "0-0", block_ms: int = 2000, *, owner: str | None = None
    ) -> AsyncIterator[tuple[str, str, bytes]]:
        """(event id, event name, data) from after `last_id`, until the job's final status; an
        empty event name is a keep-alive. Reads go through `streams`; between yields at most
        `event_batch_bytes` of result lines (or one line) are held."""
        await self.get(job_id, owner=owner, client=self.streams)
        key = keys.job_events_key(job_id)
        while True:
            try:
                batch = await self._read_events(key, last_id, block_ms)
            except REDIS_ERRORS as exc:
                raise Unavailable(f"Redis is unreachable: {exc}") from exc
            if self._streams_ended.is_set():
                return
            read = [entry for _, entries in batch or [] for entry in entries]
            batch = None
            idle = not read
            events = _expand(read, last_id)
            del read
            while events:
                group, lines = await self._within_bytes(job_id, events)
                events = events[len(group) :]
                for event_id, fields in group:
                    last_id = event_id
                    event = fields[b"event"].decode()
                    data = fields.get(b"data")
                    yield last_id, event, bytes(data if data is not None else lines.pop(0) or b"null")
                    if event == "status":
                        return
                del group, lines  # a slow reader holds one group at most
            if idle:
                job = await self.get(job_id, client=self.streams)
                if job.status not in TERMINAL:
                    # Nothing for `block_ms`: an empty event (sent as an SSE comment) keeps the
                    # connection alive and shows a client that left.
                    yield last_id, "", b""
                    continue
                # Resumed at or after the final event (or the job expired): still end with a
                # status event, so a client knows not to reconnect.
                yield last_id, "status", msgspec.json.encode({"status": job.status})
                return

    async def _within_bytes(self, job_id: str, entries: list[Any]) -> tuple[list[Any], list[bytes | None]]:
        """The first of `entries` whose result lines fit `event_batch_bytes` (at least one), and
        those lines in order, in one read: a result event carries its index, not a second copy
        of the line."""
        # At most one read's worth of indices: an entry of a chunk's lines expands to many.
        indices = [fields[b"index"] for _, fields in entries if b"index" in fields][:_EVENTS_PER_READ]
        if not indices:
            return entries, []
        try:
            lines = await self._lines_within(
                keys=[keys.job_results_key(job_id)],
                args=[self.event_batch_bytes, len(indices), *indices],
                client=self.streams,
            )
        except REDIS_ERRORS as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc
        seen, cut = 0, len(entries)
        for position, (_, fields) in enumerate(entries):
            if b"index" in fields:
                if seen == len(lines):
                    cut = position
                    break
                seen += 1
        return entries[:cut], list(lines)

    async def _read_events(self, key: str, last_id: str, block_ms: int) -> Any:
        """One XREAD of `key` after `last_id`, given up (None) when the streams are ended."""
        if self._streams_ended.is_set():
            return None
        read = asyncio.ensure_future(
            self.streams.xread({key: last_id}, count=_EVENTS_PER_READ, block=block_ms)
        )
        ended = asyncio.ensure_future(self._streams_ended.wait())
        try:
            await asyncio.wait({read, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (read, ended):
                if not waiting.done():
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
        return read.result() if not read.cancelled() else None


def _event_id(text: str) -> tuple[int, int]:
    """A stream id (`ms-seq`, or `ms`: its first) as a pair that orders as Redis orders them."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _expand(entries: list[Any], after: str) -> list[tuple[str, dict[bytes, bytes]]]:
    """The events a reader sends for stream `entries` read after id `after`, each with its id: a
    `results` entry (the lines one chunk stored) is one `result` event per line, line k of n
    with id ms-(seq-n+1+k) (the chunk script leaves those ids free below the entry's own), and
    those at or before `after` were sent before a resumed read. Any other entry is one event."""
    out: list[tuple[str, dict[bytes, bytes]]] = []
    since = _event_id(after)
    for entry_id, fields in entries:
        raw = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        if fields.get(b"event") != b"results":
            out.append((raw, fields))
            continue
        ms, seq = _event_id(raw)
        indices = fields[b"indices"].split(b",")
        first = seq - len(indices) + 1
        for k, index in enumerate(indices):
            if (ms, first + k) > since:
                out.append((f"{ms}-{first + k}", {b"event": b"result", b"index": index}))
    return out


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


def _head_length(line: bytes) -> int:
    """The length of `{"index":N,"custom_id":X` in a `result_line`: what an error line in its
    place keeps (the store script cuts there)."""
    start = line.index(b'"custom_id":') + len(b'"custom_id":')
    if line.startswith(b"null", start):
        return start + 4
    end = start + 1
    while line[end] != 0x22:  # the closing quote; msgspec escapes any inside as \"
        end += 2 if line[end] == 0x5C else 1
    return end + 1


def _optional_float(fields: dict[str, str], name: str) -> float | None:
    return float(fields[name]) if name in fields else None

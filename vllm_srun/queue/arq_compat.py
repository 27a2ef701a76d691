"""Everything the queue takes from arq beyond its public API, in one place.

arq runs our jobs (retries, timeouts, in-progress keys, job expiry), but two of its habits cost
the request path time, so we work around them here:

- **Enqueueing.** `ArqRedis.enqueue_job` WATCHes each job key to refuse a duplicate id, a few
  round trips per job. Our ids are fresh UUIDs, so `add_job` writes the job body
  (`arq.jobs.serialize_job`, under `arq.constants.job_key_prefix`) and its queue entry into a
  pipeline the caller executes with its own commands (the wake-up publish), in arq's layout;
  `get_or_add_job` does the same in a script that first looks the job's results up.
- **Polling and running.** arq's `Worker.main` sleeps `poll_delay` between polls, and a job
  costs it several round trips: the poll's ZRANGEBYSCORE, a WATCH/MULTI claim per job, the body
  and retry-counter reads of `run_job`, and `finish_job`. `DrivenWorker` lets the caller drive
  the loop instead (`poll()`), so a worker polls as soon as it is woken; one Lua script finds
  the due jobs, claims them (the in-progress key, `arq.constants.in_progress_key_prefix`, value
  `1`, exactly as arq's own `start_jobs` writes it) and returns their bodies and tries (arq's
  retry counter, `retry_key_prefix`, as its `run_job` counts it). A job runs without arq's
  per-job logging; its function sends arq's finishing writes with its own last ones (`Finish`),
  and any other end goes through arq's own `finish_job`/`finish_failed_job`. Each slot is
  released with `Worker._release_sem_dec_counter_on_complete`.
- **Leases.** arq lets a dead worker's job run again only when its in-progress key expires
  (the job timeout + 10 s). The claim script also leases each job it takes (`keys.lease_key`,
  member = job id, score = expiry in ms) and returns the job's crash count; `requeue_lapsed`
  puts the jobs of lapsed leases back the way arq's own expiry would (it deletes the in-progress
  key; the job body and its queue entry stay, so the job is due at its old score) and counts a
  crash; `release` gives held jobs back at a graceful stop. See queue/leases.py.

What this relies on: those private methods and constants, the Worker attributes named in
`WORKER_ATTRIBUTES`, and the job layout `{"t", "f", "a", "k", "et"}`. `arq==0.28.*` is pinned;
tests/queue/test_arq_compat.py fails, naming what changed, if an upgrade breaks any of it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from typing import Any

from arq import Worker
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.jobs import SerializationError, deserialize_job_raw, serialize_job
from arq.utils import ms_to_datetime, timestamp_ms
from redis.asyncio.client import Pipeline

from vllm_srun import defaults
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.redis import is_cluster, pipeline, publish, run_script, wait_replica

log = logging.getLogger("arq.worker")  # where arq's own run_job reports a job that fails

# Worker state read or changed here, beyond its constructor's arguments.
WORKER_ATTRIBUTES = (
    "pool",
    "queue_name",
    "ctx",
    "sem",
    "job_counter",
    "max_jobs",
    "tasks",
    "loop",
    "in_progress_timeout_s",
    "poll_delay_s",
    "queue_read_limit",
    "functions",
    "max_tries",
    "job_timeout_s",
    "job_deserializer",
)
# Worker methods called or overridden here, and the parameters each takes after `self`.
WORKER_METHODS = {
    "_release_sem_dec_counter_on_complete": (),
    "heart_beat": (),
    "finish_job": (
        "job_id",
        "finish",
        "result_data",
        "result_timeout_s",
        "keep_result_forever",
        "incr_score",
        "keep_in_progress",
    ),
    "finish_failed_job": ("job_id", "result_data"),
}


def add_job(
    pipe: Pipeline, *, queue: str, function: str, payload: bytes, expires_s: float, job_id: str = ""
) -> str:
    """Queue one arq job (function(payload)) on `pipe`; returns its id (a fresh one carries the
    queue's hash tag, keys.arq_job_id, so the job's keys share the queue's slot)."""
    job_id = job_id or "{" + keys.key_slot_tag(queue) + "}" + uuid.uuid4().hex
    now_ms = int(time.time() * 1000)
    body = serialize_job(function, (payload,), {}, None, now_ms, serializer=protocol.serialize)
    pipe.psetex(job_key_prefix + job_id, int(expires_s * 1000), body)
    pipe.zadd(queue, {job_id: now_ms})
    return job_id


# Looks up result keys (KEYS[3..], none: queues at once) and, only when none is there, queues
# the arq job (body ARGV[1] under KEYS[2], entry ARGV[4] in the queue KEYS[1] at ARGV[3]) and
# wakes the workers (ARGV[5]), as `add_job` and a publish would: a request whose inputs all miss
# costs one round trip.
_GET_OR_ADD = """
local found = {}
if #KEYS > 2 then found = redis.call('MGET', unpack(KEYS, 3)) end
for i = 1, #found do
  if found[i] then return found end
end
redis.call('PSETEX', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('PUBLISH', ARGV[5], '1')
return found
"""

# Bounds the result keys one get-or-add script looks up (Lua's unpack has a stack limit); a
# larger job is looked up and queued in two steps.
GET_OR_ADD_MAX_KEYS = 512


async def get_or_add_job(
    pool: Any,
    *,
    queue: str,
    function: str,
    payload: bytes,
    expires_s: float,
    job_id: str,
    result_keys: list[str],
    wake_channel: str,
) -> list[bytes | None]:
    """What `result_keys` hold; when they hold nothing (or none are given), the job is queued and
    its workers woken, in the same step (a job for inputs already stored would only run them
    again). The result keys must share the queue's slot on a cluster: there, give none."""
    now_ms = int(time.time() * 1000)
    body = serialize_job(function, (payload,), {}, None, now_ms, serializer=protocol.serialize)
    if is_cluster(pool):
        # Queued once a replica has it: a failover loses no job a request waits for.
        async with pool.pipeline(transaction=False) as pipe:
            await run_script(
                pipe,
                _GET_OR_ADD,
                [queue, job_key_prefix + job_id, *result_keys],
                [body, int(expires_s * 1000), now_ms, job_id, wake_channel],
            )
            wait_replica(pipe, pool, queue)
            replies = await pipe.execute()
        return list(replies[0])
    script = pool.register_script(_GET_OR_ADD)  # local: hashes the script, no round trip
    found: list[bytes | None] = await script(
        keys=[queue, job_key_prefix + job_id, *result_keys],
        args=[body, int(expires_s * 1000), now_ms, job_id, wake_channel],
    )
    return found


def remove_job(pipe: Pipeline, *, queue: str, job_id: str) -> None:
    """Take a job that no worker has started out of its queue (a started one finishes)."""
    pipe.zrem(queue, job_id)
    pipe.delete(job_key_prefix + job_id)


# Claims up to ARGV[8] due jobs (of the first ARGV[9] due entries of KEYS[1]) in one step, as
# arq's poll iteration (ZRANGEBYSCORE), start_jobs (WATCH, EXISTS, MULTI/PSETEX/EXEC per job) and
# run_job's first pipeline (GET the body, INCR and EXPIRE the retry counter) do one after another:
# a job is taken when it is due and no worker holds it. Each job taken is leased (KEYS[2]) in the
# same step, so no claimed job is ever without a lease. Per job: id, score, crash count, body
# ('' when it expired), try and the request ids withdrawn from it (keys.withdrawn_key).
_CLAIM = """
local now, ttl, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local lease_until, crashes, job, retry = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local free, withdrawn = tonumber(ARGV[8]), ARGV[10]
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[9]))
local out = {}
for i = 1, #due, 2 do
  if free <= 0 then break end
  local id = due[i]
  if redis.call('EXISTS', prefix .. id) == 0 then
    redis.call('PSETEX', prefix .. id, ttl, '1')
    redis.call('ZADD', KEYS[2], lease_until, id)
    local try = redis.call('INCR', retry .. id)
    redis.call('EXPIRE', retry .. id, 88400)
    table.insert(out, id)
    table.insert(out, due[i + 1])
    table.insert(out, redis.call('GET', crashes .. id) or '0')
    table.insert(out, redis.call('GET', job .. id) or '')
    table.insert(out, try)
    table.insert(out, redis.call('SMEMBERS', withdrawn .. id))
    free = free - 1
  end
end
return out
"""

# Puts back the jobs whose leases (KEYS[1]) lapsed before ARGV[1]: a job still queued (KEYS[2])
# whose body exists loses its in-progress key, so any worker claims it again, and its crash count
# goes up; a lease on a job that has finished is just dropped. One wake-up (ARGV[6]) for all.
_REQUEUE = """
local now, in_progress, job, crashes, crash_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[7]))
local back = {}
for _, id in ipairs(lapsed) do
  redis.call('ZREM', KEYS[1], id)
  if redis.call('ZSCORE', KEYS[2], id) and redis.call('EXISTS', job .. id) == 1 then
    redis.call('DEL', in_progress .. id)
    redis.call('INCR', crashes .. id)
    redis.call('EXPIRE', crashes .. id, crash_ttl)
    table.insert(back, id)
  end
end
if #back > 0 and ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], 'requeued') end
return back
"""

# Gives held jobs back without counting a crash: this worker stops and will not finish them.
_RELEASE = """
for i = 2, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('DEL', ARGV[1] .. ARGV[i])
end
return 1
"""


async def requeue_lapsed(
    client: Any, *, queue: str, wake_channel: str, now_ms: int, limit: int = 1000
) -> Any:
    """Run the requeue script for `queue` on `client`: on a pool, returns the ids put back; on a
    pipeline, queues it (its reply, those ids, comes with the pipeline's)."""
    args = [
        now_ms,
        in_progress_key_prefix,
        job_key_prefix,
        keys.CRASHES_PREFIX,
        defaults.JOB_TTL_S,
        wake_channel,
        limit,
    ]
    return await run_script(client, _REQUEUE, [keys.lease_key(queue), queue], args)


async def release(pool: Any, *, queue: str, wake_channel: str, job_ids: list[str]) -> None:
    """Give `job_ids` back to `queue` now (a graceful stop), and wake the other workers."""
    if not job_ids:
        return
    async with pool.pipeline(transaction=False) as pipe:
        await run_script(pipe, _RELEASE, [keys.lease_key(queue)], [in_progress_key_prefix, *job_ids])
        publish(pipe, wake_channel, b"released", after=keys.lease_key(queue))
        await pipe.execute()


class Finish:
    """arq's bookkeeping for a job that ends well, for the job itself to send with its last writes.

    A job function finds it in `ctx[FINISH]`; `on(pipe)` queues what arq's `finish_job` would do
    for a finished job without a kept result (the in-progress key, retry counter and body
    deleted, the queue entry removed), and drops its set of withdrawn requests, on a pipeline to the main Redis that the job executes with
    its own commands, so a job's results, reply and acknowledgement are one round trip. A job
    that returns without calling it is finished by the worker, in a round trip of its own."""

    def __init__(self, queue_name: str, job_id: str) -> None:
        self.queue_name = queue_name
        self.job_id = job_id
        self.sent = False

    def on(self, pipe: Pipeline) -> None:
        job_id = self.job_id
        pipe.delete(
            in_progress_key_prefix + job_id,
            retry_key_prefix + job_id,
            job_key_prefix + job_id,
            keys.withdrawn_key(job_id),
        )
        pipe.zrem(self.queue_name, job_id)
        self.sent = True


# The key of a job's `Finish` in the ctx its function is called with.
FINISH = "finish"
# The key of the request ids withdrawn from a job before it was claimed, in the same ctx.
WITHDRAWN = "withdrawn"


class DrivenWorker(Worker):
    """arq's Worker without its own loop: the caller calls `poll()` whenever work may be due.

    A poll claims due jobs in one round trip (the claim script, bodies included), and a job runs
    without arq's per-job reads and logging (`_run`); its end is acknowledged with its own writes
    (`Finish`) or, failing that, by arq's `finish_job`/`finish_failed_job`. Every job it claims
    is leased for `lease_s`; `held()` names the jobs to renew, `released()` those finished since
    the last renewal, and `crashes` each running job's crash count."""

    def __init__(
        self, *args: Any, lease_s: float = defaults.LEASE_S, wake_channel: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lease_s = lease_s
        self.wake_channel = wake_channel
        self.crashes: dict[str, int] = {}
        self._finished: list[str] = []

    async def poll(self) -> None:
        """Claim and start due jobs, reap finished ones (what arq's poll iteration does)."""
        self.ctx["redis"] = self.pool  # what arq's main() sets before its first poll
        await self._claim()
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # as arq's poll iteration: an error in a job's run surfaces here
        await self.heart_beat()

    def running(self) -> list[asyncio.Task[Any]]:
        """The tasks of the jobs this worker has started and not yet reaped."""
        return list(self.tasks.values())

    def held(self) -> list[str]:
        """The ids of the jobs this worker runs now: their leases are to be renewed."""
        return [job_id for job_id, task in self.tasks.items() if not task.done()]

    def released(self) -> list[str]:
        """The ids of the jobs finished since the last call: their leases are to be dropped."""
        done, self._finished = self._finished, []
        return done

    @property
    def lease_key(self) -> str:
        return keys.lease_key(self.queue_name)

    async def _claim(self) -> None:
        free = self.max_jobs - self.job_counter
        if free <= 0:
            return
        now = timestamp_ms()
        args: list[Any] = [
            now,
            int(self.in_progress_timeout_s * 1000),
            in_progress_key_prefix,
            now + int(self.lease_s * 1000),
            keys.CRASHES_PREFIX,
            job_key_prefix,
            retry_key_prefix,
            free,
            self.queue_read_limit,
            keys.WITHDRAWN_PREFIX,
        ]
        claim = self.pool.register_script(_CLAIM)  # local: hashes the script, no round trip
        claimed = await claim(keys=[self.queue_name, self.lease_key], args=args)
        for i in range(0, len(claimed), 6):
            raw_id, score, crashes, body, job_try, withdrawn = claimed[i : i + 6]
            job_id = raw_id.decode()
            await self.sem.acquire()
            self.job_counter += 1
            self.crashes[job_id] = int(crashes)
            gone = frozenset(member.decode() for member in withdrawn)
            task = self.loop.create_task(self._run(job_id, int(float(score)), body, int(job_try), gone))
            task.add_done_callback(functools.partial(self._done, job_id))
            self.tasks[job_id] = task

    async def _run(
        self, job_id: str, score: int, body: bytes, job_try: int, withdrawn: frozenset[str] = frozenset()
    ) -> None:
        """arq's run_job for a job claimed with its body: its outcomes (expired, unknown function,
        too many tries, failed, cancelled: run again, done) end the job as arq's would. The job
        function finds the request ids withdrawn before the claim in `ctx[WITHDRAWN]`."""
        if not body:
            log.warning("job %s expired", job_id)
            return await asyncio.shield(self.finish_failed_job(job_id, None))
        try:
            name, args, kwargs, enqueue_try, enqueue_time_ms = deserialize_job_raw(
                body, deserializer=self.job_deserializer
            )
            function = self.functions[name]
        except (SerializationError, KeyError):
            log.exception("job %s cannot run", job_id)
            return await asyncio.shield(self.finish_failed_job(job_id, None))
        job_try = max(job_try, enqueue_try or 0)
        max_tries = self.max_tries if function.max_tries is None else function.max_tries
        if job_try > max_tries:
            log.warning("job %s: max %d tries exceeded", job_id, max_tries)
            return await asyncio.shield(self.finish_failed_job(job_id, None))
        finish = Finish(self.queue_name, job_id)
        ctx = {
            **self.ctx,
            "job_id": job_id,
            "job_try": job_try,
            "enqueue_time": ms_to_datetime(enqueue_time_ms),
            "score": score,
            FINISH: finish,
            WITHDRAWN: withdrawn,
        }
        timeout_s = self.job_timeout_s if function.timeout_s is None else function.timeout_s
        done = True
        try:
            async with asyncio.timeout(timeout_s):
                await function.coroutine(ctx, *args, **kwargs)
        except asyncio.CancelledError:
            done = False  # as arq with retry_jobs: a cancelled job runs again
        except Exception:
            log.exception("job %s failed", job_id)
        else:
            if finish.sent:
                return None
        await asyncio.shield(self.finish_job(job_id, done, None, None, False, None, None))
        return None

    async def finish_job(
        self,
        job_id: str,
        finish: bool,
        result_data: bytes | None,
        result_timeout_s: float | None,
        keep_result_forever: bool,
        incr_score: int | None,
        keep_in_progress: float | None,
    ) -> None:
        """arq's finish_job for our jobs (no kept results, no aborts, no keep_in_progress): arq's
        own also updates its global `arq:abort` set in the same MULTI, which on a Redis Cluster
        is another slot; every key here shares the job's (keys.arq_job_id)."""
        async with pipeline(self.pool, transaction=True) as tr:
            if finish:
                tr.delete(in_progress_key_prefix + job_id, retry_key_prefix + job_id, job_key_prefix + job_id)
                tr.zrem(self.queue_name, job_id)
            else:
                if incr_score:
                    tr.zincrby(self.queue_name, incr_score, job_id)
                tr.delete(in_progress_key_prefix + job_id)
            await tr.execute()

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        """arq's finish_failed_job without its `arq:abort` set and kept result (see finish_job)."""
        await self.finish_job(job_id, True, None, None, False, None, None)

    def _done(self, job_id: str, _: asyncio.Task[Any]) -> None:
        self._release_sem_dec_counter_on_complete()
        self.crashes.pop(job_id, None)
        self._finished.append(job_id)

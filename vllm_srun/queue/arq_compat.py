"""Everything the queue takes from arq beyond its public API, in one place.

arq runs our jobs (retries, timeouts, in-progress keys, job expiry), but two of its habits cost
the request path time, so we work around them here:

- **Enqueueing.** `ArqRedis.enqueue_job` WATCHes each job key to refuse a duplicate id, a few
  round trips per job. Our ids are fresh UUIDs, so `add_job` writes the job body
  (`arq.jobs.serialize_job`, under `arq.constants.job_key_prefix`) and its queue entry into a
  pipeline the caller executes with its own commands (the wake-up publish), in arq's layout.
- **Polling.** arq's `Worker.main` sleeps `poll_delay` between polls. `DrivenWorker` lets the
  caller drive the loop instead (`poll()` runs one of arq's poll iterations,
  `Worker._poll_iteration`), so a worker polls as soon as it is woken. Its `start_jobs` claims
  all due jobs in one Lua script instead of a WATCH/MULTI per job, writing the in-progress key
  (`arq.constants.in_progress_key_prefix`, value `1`) exactly as arq's own `start_jobs` does, and
  releases each slot with `Worker._release_sem_dec_counter_on_complete`.
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
import time
import uuid
from typing import Any

from arq import Worker
from arq.constants import in_progress_key_prefix, job_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.asyncio.client import Pipeline

from vllm_srun import defaults
from vllm_srun.queue import keys, protocol

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
)
# Worker methods called or overridden here, and the parameters each takes after `self`.
WORKER_METHODS = {
    "_poll_iteration": (),
    "_release_sem_dec_counter_on_complete": (),
    "start_jobs": ("job_ids",),
    "run_job": ("job_id", "score"),
}


def add_job(
    pipe: Pipeline, *, queue: str, function: str, payload: bytes, expires_s: float, job_id: str = ""
) -> str:
    """Queue one arq job (function(payload)) on `pipe`; returns its id."""
    job_id = job_id or uuid.uuid4().hex
    now_ms = int(time.time() * 1000)
    body = serialize_job(function, (payload,), {}, None, now_ms, serializer=protocol.serialize)
    pipe.psetex(job_key_prefix + job_id, int(expires_s * 1000), body)
    pipe.zadd(queue, {job_id: now_ms})
    return job_id


def remove_job(pipe: Pipeline, *, queue: str, job_id: str) -> None:
    """Take a job that no worker has started out of its queue (a started one finishes)."""
    pipe.zrem(queue, job_id)
    pipe.delete(job_key_prefix + job_id)


# Claims the given queued jobs at once, as arq's start_jobs does one by one (WATCH, EXISTS,
# ZSCORE, MULTI/PSETEX/EXEC per job): a job is taken when it is due and no worker holds it. Each
# job taken is leased (KEYS[2]) in the same step, so no claimed job is ever without a lease, and
# comes back with its crash count.
_CLAIM = """
local now, ttl, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local lease_until, crashes = ARGV[4], ARGV[5]
local out = {}
for i = 6, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= now and redis.call('EXISTS', prefix .. id) == 0 then
    redis.call('PSETEX', prefix .. id, ttl, '1')
    redis.call('ZADD', KEYS[2], lease_until, id)
    table.insert(out, id)
    table.insert(out, score)
    table.insert(out, redis.call('GET', crashes .. id) or '0')
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
    script = client.register_script(_REQUEUE)  # local: hashes the script, no round trip
    args = [
        now_ms,
        in_progress_key_prefix,
        job_key_prefix,
        keys.CRASHES_PREFIX,
        defaults.JOB_TTL_S,
        wake_channel,
        limit,
    ]
    return await script(keys=[keys.lease_key(queue), queue], args=args, client=client)


async def release(pool: Any, *, queue: str, wake_channel: str, job_ids: list[str]) -> None:
    """Give `job_ids` back to `queue` now (a graceful stop), and wake the other workers."""
    if not job_ids:
        return
    async with pool.pipeline(transaction=False) as pipe:
        await pipe.register_script(_RELEASE)(
            keys=[keys.lease_key(queue)], args=[in_progress_key_prefix, *job_ids], client=pipe
        )
        pipe.publish(wake_channel, b"released")
        await pipe.execute()


class DrivenWorker(Worker):
    """arq's Worker without its own loop: the caller calls `poll()` whenever work may be due.

    Every job it claims is leased for `lease_s`; `held()` names the jobs to renew, `released()`
    those finished since the last renewal, and `crashes` each running job's crash count."""

    def __init__(
        self, *args: Any, lease_s: float = defaults.LEASE_S, wake_channel: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lease_s = lease_s
        self.wake_channel = wake_channel
        self.crashes: dict[str, int] = {}
        self._finished: list[str] = []

    async def poll(self) -> None:
        """One of arq's poll iterations: claim and start due jobs, reap finished ones."""
        self.ctx["redis"] = self.pool  # what arq's main() sets before its first poll
        await self._poll_iteration()

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

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        free = self.max_jobs - self.job_counter
        if free <= 0 or not job_ids:
            return
        now = timestamp_ms()
        args: list[Any] = [
            now,
            int(self.in_progress_timeout_s * 1000),
            in_progress_key_prefix,
            now + int(self.lease_s * 1000),
            keys.CRASHES_PREFIX,
        ]
        claim = self.pool.register_script(_CLAIM)  # local: hashes the script, no round trip
        claimed = await claim(keys=[self.queue_name, self.lease_key], args=[*args, *job_ids[:free]])
        for raw_id, score, crashes in zip(claimed[::3], claimed[1::3], claimed[2::3], strict=True):
            job_id = raw_id.decode()
            await self.sem.acquire()
            self.job_counter += 1
            self.crashes[job_id] = int(crashes)
            task = self.loop.create_task(self.run_job(job_id, int(float(score))))
            task.add_done_callback(functools.partial(self._done, job_id))
            self.tasks[job_id] = task

    def _done(self, job_id: str, _: asyncio.Task[Any]) -> None:
        self._release_sem_dec_counter_on_complete()
        self.crashes.pop(job_id, None)
        self._finished.append(job_id)

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

What this relies on: those private methods and constants, the Worker attributes named in
`WORKER_ATTRIBUTES`, and the job layout `{"t", "f", "a", "k", "et"}`. `arq==0.28.*` is pinned;
tests/queue/test_arq_compat.py fails, naming what changed, if an upgrade breaks any of it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from arq import Worker
from arq.constants import in_progress_key_prefix, job_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.asyncio.client import Pipeline

from vllm_srun.queue import protocol

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
# ZSCORE, MULTI/PSETEX/EXEC per job): a job is taken when it is due and no worker holds it.
_CLAIM = """
local now, ttl, prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= now and redis.call('EXISTS', prefix .. id) == 0 then
    redis.call('PSETEX', prefix .. id, ttl, '1')
    table.insert(out, id)
    table.insert(out, score)
  end
end
return out
"""


class DrivenWorker(Worker):
    """arq's Worker without its own loop: the caller calls `poll()` whenever work may be due."""

    async def poll(self) -> None:
        """One of arq's poll iterations: claim and start due jobs, reap finished ones."""
        self.ctx["redis"] = self.pool  # what arq's main() sets before its first poll
        await self._poll_iteration()

    def running(self) -> list[asyncio.Task[Any]]:
        """The tasks of the jobs this worker has started and not yet reaped."""
        return list(self.tasks.values())

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        free = self.max_jobs - self.job_counter
        if free <= 0 or not job_ids:
            return
        args: list[Any] = [timestamp_ms(), int(self.in_progress_timeout_s * 1000), in_progress_key_prefix]
        claim = self.pool.register_script(_CLAIM)  # local: hashes the script, no round trip
        claimed = await claim(keys=[self.queue_name], args=[*args, *job_ids[:free]])
        for job_id, score in zip(claimed[::2], claimed[1::2], strict=True):
            await self.sem.acquire()
            self.job_counter += 1
            task = self.loop.create_task(self.run_job(job_id.decode(), int(float(score))))
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
            self.tasks[job_id.decode()] = task

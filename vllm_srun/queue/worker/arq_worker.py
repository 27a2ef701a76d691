"""The worker side of arq: `DrivenWorker` claims, leases, runs and finishes jobs in arq's layout.

A caller drives it (`poll()`) instead of arq's timed loop; a claimed job is leased
(`keys.lease_key`), `requeue_lapsed` puts back the jobs of lapsed leases and `release` gives
held jobs back at a stop. A job function acknowledges its end with its own writes (`ctx[FINISH]`).
What this relies on in arq is named in `WORKER_ATTRIBUTES` and `WORKER_METHODS`; `arq==0.28.*`
is pinned, and tests/queue/worker/test_arq_worker.py names what an upgrade broke.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from arq import Worker
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.jobs import SerializationError, deserialize_job_raw
from arq.utils import ms_to_datetime, timestamp_ms
from redis.asyncio.client import Pipeline

from vllm_srun import defaults
from vllm_srun.queue import keys, scripts
from vllm_srun.queue.redis import lost_connection, pipeline, publish, run_script

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

# Claims due jobs, leases them and returns their bodies and tries, in one step.
_CLAIM = scripts.load("claim_jobs")
# Puts back the jobs of lapsed leases and counts a crash for each.
_REQUEUE = scripts.load("requeue_lapsed")
# Gives held jobs back without counting a crash.
_RELEASE = scripts.load("release_jobs")


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
# A job's finish that met a lost Redis is sent again after this, doubling up to the maximum.
FINISH_RETRY_S = 0.1
FINISH_RETRY_MAX_S = 2.0
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
        await asyncio.shield(self._finish(job_id, done))
        return None

    async def _finish(self, job_id: str, done: bool) -> None:
        """`finish_job`, tried again while Redis is lost (a failover): until it lands the job is
        still held, its lease renewed, so a job never stays claimed in Redis with no lease."""
        delay_s = FINISH_RETRY_S
        while True:
            try:
                return await self.finish_job(job_id, done, None, None, False, None, None)
            except Exception as exc:
                if not lost_connection(exc):
                    raise
                log.warning("job %s: finishing waits for Redis: %r", job_id, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, FINISH_RETRY_MAX_S)

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

    def _done(self, job_id: str, task: asyncio.Task[Any]) -> None:
        self._release_sem_dec_counter_on_complete()
        self.crashes.pop(job_id, None)
        if task.cancelled() or task.exception() is None:
            self._finished.append(job_id)
        # Else its end never reached Redis: its lease is left to lapse, and the job to be put back.

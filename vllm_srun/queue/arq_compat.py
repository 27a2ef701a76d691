"""The submit side of arq: queue and remove jobs in arq's own layout, without its round trips.

`add_job` writes a job's body and queue entry on a caller's pipeline; `get_or_add_job` looks
the job's results up and queues it only when none is stored, in one script. The worker side
(claiming, leases, finishing) is `vllm_srun.queue.worker.arq_worker`. `arq==0.28.*` is pinned;
tests/queue/test_arq_compat.py fails, naming what changed, if an upgrade breaks the layout.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from redis.asyncio.client import Pipeline

from vllm_srun.queue import keys, protocol, scripts
from vllm_srun.queue.redis import is_cluster, run_script, wait_replica

# Looks a job's results up and queues it only when none is there (lua/get_or_add_job.lua).
_GET_OR_ADD = scripts.load("get_or_add_job")


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

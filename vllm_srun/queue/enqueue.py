"""Writing arq jobs without arq's per-job round trips.

arq's `enqueue_job` WATCHes each job key to refuse duplicate ids; our ids are fresh UUIDs, so
the check buys nothing and costs round trips. These helpers add the job body and its queue
entry to a pipeline the caller executes, in arq's own layout, so arq's worker runs them as
if arq had enqueued them.
"""

from __future__ import annotations

import time
import uuid

from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from redis.asyncio.client import Pipeline

from vllm_srun.queue import protocol


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

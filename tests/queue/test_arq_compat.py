"""The submit side's use of arq (vllm_srun/queue/arq_compat.py) still matches arq's job layout.

Each failure names what an arq upgrade changed, so the fix starts in arq_compat.py, not in a
stalled worker.
"""

from __future__ import annotations

import inspect

import arq
import arq.constants
import arq.jobs
from arq import Worker
from arq.connections import ArqRedis
from arq.jobs import Job, JobStatus

from vllm_srun.queue import protocol
from vllm_srun.queue.arq_compat import add_job, remove_job

QUEUE = "test:queue"


def test_the_constants_and_job_serializer_are_where_they_were() -> None:
    assert arq.constants.job_key_prefix == "arq:job:", "arq changed its job key prefix"
    assert arq.constants.in_progress_key_prefix == "arq:in-progress:", "arq changed its in-progress prefix"
    params = tuple(inspect.signature(arq.jobs.serialize_job).parameters)
    assert params[:5] == ("function_name", "args", "kwargs", "job_try", "enqueue_time_ms"), (
        f"arq {arq.VERSION}: serialize_job's parameters changed to {params}"
    )
    # The in-progress key arq writes when it claims a job, which the claim script writes too.
    assert "psetex(in_progress_key, int(self.in_progress_timeout_s * 1000), b'1')" in inspect.getsource(
        Worker.start_jobs
    ), f"arq {arq.VERSION}: start_jobs writes the in-progress key differently; update lua/claim_jobs.lua"


async def test_a_job_written_by_hand_reads_back_through_arq(redis: ArqRedis) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        job_id = add_job(pipe, queue=QUEUE, function="echo", payload=b"\x01\x02", expires_s=60)
        await pipe.execute()
    job = Job(job_id, redis, _queue_name=QUEUE, _deserializer=protocol.deserialize)
    info = await job.info()
    assert info is not None, "arq cannot read the job add_job wrote"
    assert (info.function, tuple(info.args), info.kwargs) == ("echo", (b"\x01\x02",), {})
    assert info.score is not None and info.job_try is None
    assert await job.status() == JobStatus.queued

    async with redis.pipeline(transaction=True) as pipe:
        remove_job(pipe, queue=QUEUE, job_id=job_id)
        await pipe.execute()
    assert await job.status() == JobStatus.not_found

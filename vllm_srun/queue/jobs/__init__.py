"""Bulk jobs in Redis: creation, status, results in input order, events, cancellation.

A job is a list of surface requests split into chunks, each an arq job on the deployment's
bulk queue. Everything about a job lives under `job:{id}` with a TTL, so any app replica can
read or stream it, whichever replica created it. `BulkStore` is the one way in.
"""

from vllm_srun.queue.jobs.events import EventReader
from vllm_srun.queue.jobs.records import (
    CACHED,
    DONE,
    FAILED,
    JOB_ID,
    SKIPPED,
    TERMINAL,
    BulkQuotas,
    JobCounts,
    JobStatus,
    ResultLine,
    error_body,
    result_line,
)
from vllm_srun.queue.jobs.store import RESULTS_SLICE, BulkStore

__all__ = [
    "CACHED",
    "DONE",
    "FAILED",
    "JOB_ID",
    "RESULTS_SLICE",
    "SKIPPED",
    "TERMINAL",
    "BulkQuotas",
    "BulkStore",
    "EventReader",
    "JobCounts",
    "JobStatus",
    "ResultLine",
    "error_body",
    "result_line",
]

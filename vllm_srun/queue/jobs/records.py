"""A bulk job's records: its status types, its quotas, its result lines, and reading them back.

Pure except `job_fields` (one HGETALL). A job id is `JOB_ID` or names no job; a result line
is `{"index", "custom_id", "response"|"error"}` with the body inside verbatim.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import msgspec
from redis.exceptions import ResponseError

from vllm_srun.errors import JobNotFound
from vllm_srun.queue import keys
from vllm_srun.queue.redis import out_of_memory, state_full, unavailable_when_lost

TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# What `create` hands out. Anything else names no job: checked before a key is built from it,
# so a crafted id ("job_…:results") cannot reach another key of the job.
JOB_ID = re.compile(r"job_[0-9a-f]{32}")
# Result kinds, as stored and as the chunk script counts them: done, failed, done from the
# cache, skipped because the job was cancelled. Defined here only; the chunk script is filled in.
DONE, FAILED, CACHED, SKIPPED = "d", "f", "c", "x"
# Lines one HMGET or HSET of the chunk script reads or stores (Lua's unpack has a stack limit).
HSET_BATCH = 500


@dataclass(frozen=True, kw_only=True)
class BulkQuotas:
    """What bulk jobs may hold in the state Redis (docs/deployment.md, sizing the state Redis).
    The per-job request count is `--max-job-requests`, checked before validation."""

    # Items of all live jobs not yet stored (queued or running), across every model.
    max_queued_items: int = 2_000_000
    # Result bytes one job may store, and all live jobs together.
    max_job_result_bytes: int = 256 * 1024 * 1024
    max_stored_result_bytes: int = 384 * 1024 * 1024


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


def head_length(line: bytes) -> int:
    """The length of `{"index":N,"custom_id":X` in a `result_line`: what an error line in its
    place keeps (the store script cuts there)."""
    start = line.index(b'"custom_id":') + len(b'"custom_id":')
    if line.startswith(b"null", start):
        return start + 4
    end = start + 1
    while line[end] != 0x22:  # the closing quote; msgspec escapes any inside as \"
        end += 2 if line[end] == 0x5C else 1
    return end + 1


_P = ParamSpec("_P")
_T = TypeVar("_T")


def redis_unavailable(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """A lost Redis is `Unavailable` (503, retry), never a bug: a job lives in Redis, so it is
    neither gone nor failed while Redis restarts."""

    @wraps(method)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            with unavailable_when_lost():
                return await method(*args, **kwargs)
        except ResponseError as exc:
            if not out_of_memory(exc):
                raise
            raise state_full() from exc

    return call


@redis_unavailable
async def job_fields(redis: Any, job_id: str) -> dict[str, str]:
    """The job's fields on `redis`, whoever owns it ({} for none, or an id that names no job)."""
    if not JOB_ID.fullmatch(job_id):
        return {}
    fields: dict[bytes, bytes] = await redis.hgetall(keys.job_key(job_id))
    return {k.decode(): v.decode() for k, v in fields.items()}


def status_of(job_id: str, fields: dict[str, str], owner: str | None) -> JobStatus:
    """The status `fields` (a job's, as `job_fields` reads them) describe; JobNotFound if there
    are none, or `owner` (a caller id; None: any caller) did not make the job. Another caller's
    job reads exactly as a job that does not exist."""
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


def _optional_float(fields: dict[str, str], name: str) -> float | None:
    return float(fields[name]) if name in fields else None

"""OpenAI's batches: POST /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel,
GET /v1/batches. A batch is one bulk job of its input file's bodies; once the job ends, the
first read writes its output and error files from the job's result lines (`lines`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

import msgspec
from litestar import get, post
from litestar.datastructures import State
from litestar.params import FromPath, JSONBody, QueryParameter

from vllm_srun.app.errors import ErrorBody, ErrorResponse, error_type, upstream_code
from vllm_srun.app.peers.failures import item_failure
from vllm_srun.app.peers.openai_batch import lines
from vllm_srun.app.peers.openai_batch.files import _options, store_of
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.service.jobs import Validator, caller_of, owner_of
from vllm_srun.errors import (
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    RequestTooLarge,
    SrunError,
    Unavailable,
    UnsupportedSurface,
)
from vllm_srun.plugins.surfaces import REGISTRY
from vllm_srun.queue.jobs import RESULTS_SLICE, TERMINAL, JobStatus
from vllm_srun.queue.jobs.batches import BatchStore

Metadata = Annotated[dict[str, str], msgspec.Meta(max_length=16)]


class BatchCreate(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: Literal["/v1/embeddings", "/v1/rerank", "/v1/classify"]
    completion_window: Literal["24h"]
    metadata: Metadata | None = None


class RequestCounts(msgspec.Struct):
    total: int
    completed: int
    failed: int


class BatchErrors(msgspec.Struct):
    data: list[lines.LineError]
    object: Literal["list"] = "list"


class Batch(msgspec.Struct):
    """OpenAI's Batch object."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    request_counts: RequestCounts
    object: Literal["batch"] = "batch"
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, str] | None = None


class BatchList(msgspec.Struct):
    data: list[Batch]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
    object: Literal["list"] = "list"


def _int(fields: dict[str, str], name: str) -> int | None:
    return int(float(fields[name])) if fields.get(name) else None


@post("/v1/batches", summary="Create a batch (OpenAI-compatible)", status_code=200)
async def create_batch(data: JSONBody[BatchCreate], state: State) -> Batch:
    runtime: Runtime = state.runtime
    if data.endpoint not in lines.ENDPOINTS:
        raise InvalidRequest(f"endpoint: one of {sorted(lines.ENDPOINTS)}", param="endpoint")
    for key, value in (data.metadata or {}).items():
        if len(key) > 64 or len(value) > 512:
            raise InvalidRequest(
                "metadata: keys of at most 64 and values of at most 512 characters", param="metadata"
            )
    caller = caller_of(runtime)
    owner = caller.id if caller is not None else ""
    store = store_of(runtime)
    await store.file(data.input_file_id, owner=owner)
    content = await store.content(data.input_file_id)
    max_lines = runtime.settings.max_job_requests
    parsed = await asyncio.to_thread(lines.parse, content, endpoint=data.endpoint, max_lines=max_lines)
    record: dict[str, Any] = {
        "endpoint": data.endpoint,
        "input_file_id": data.input_file_id,
        "completion_window": data.completion_window,
        "total": len(parsed.entries),
        **({"metadata": msgspec.json.encode(data.metadata).decode()} if data.metadata else {}),
    }
    surface = lines.ENDPOINTS[data.endpoint]
    name = ""
    if not parsed.errors:
        number, _, body = parsed.entries[0]
        try:
            _, loaded = runtime.model_for(body.get("model"))
            name = loaded.info.name
            if surface not in loaded.info.surfaces:
                raise InvalidRequest(f"model {name!r} does not serve {data.endpoint}")
        except SrunError as exc:
            parsed.errors.append(
                lines.LineError(exc.code, f"line {number}: {exc.message}", "body.model", number)
            )
    if parsed.errors:
        record.update(status="failed", failed_at=_now(), errors=msgspec.json.encode(parsed.errors).decode())
        return await _batch(store, runtime, await store.put_batch(record, owner=owner))
    # The model as the first line names it (an alias answers under that name, as the route does).
    named = parsed.entries[0][2].get("model") or name
    validator = Validator(runtime, REGISTRY.for_jobs(surface), named, "record", "line")
    await asyncio.to_thread(validator.feed, ((n, b) for n, _, b in parsed.entries))
    job, _ = await runtime.bulk.create(
        deployment=name,
        surface=surface,
        requests=validator.requests,
        custom_ids=[c for _, c, _ in parsed.entries],
        errors=validator.errors,
        owner=owner,
        cache_salt=caller.cache_salt if caller is not None else "",
    )
    # OpenAI's embeddings have no null vector: a request that did not ask for per-item errors
    # (options.overflow) fails whole on a failed input, as /v1/embeddings answers it.
    strict = "".join(
        "1" if surface == "embeddings" and not (b.get("options") or {}).get("overflow") else "0"
        for _, _, b in parsed.entries
    )
    record.update(job_id=job.id, in_progress_at=_now(), expires_at=int(job.expires_at or 0), strict=strict)
    return await _batch(store, runtime, await store.put_batch(record, owner=owner))


def _now() -> int:
    return int(time.time())


async def _batch(store: BatchStore, runtime: Runtime, fields: dict[str, str]) -> Batch:
    """The Batch object of `fields`, its job's progress read, and its files written once the
    job has ended."""
    job: JobStatus | None = None
    if fields.get("job_id"):
        job = await runtime.bulk.get(fields["job_id"], owner=fields.get("owner") or None)
        if job.status in TERMINAL and "output_file_id" not in fields:
            await _finalize(store, runtime, fields, job)
            fields = await store.batch(fields["id"], owner=fields.get("owner", ""))
    status = fields.get("status") or _status(job, fields)
    total = int(fields.get("total", "0"))
    if "completed" in fields:
        counts = RequestCounts(total, int(fields["completed"]), int(fields["failed"]))
    elif job is not None:
        counts = RequestCounts(total, job.counts.done, job.counts.failed)
    else:
        counts = RequestCounts(total, 0, 0)
    errors = None
    if fields.get("errors"):
        errors = BatchErrors(msgspec.json.decode(fields["errors"], type=list[lines.LineError]))
    ended = _int(fields, "finalizing_at")
    return Batch(
        id=fields["id"],
        endpoint=fields["endpoint"],
        input_file_id=fields["input_file_id"],
        completion_window=fields["completion_window"],
        status=status,
        created_at=int(fields["created_at"]),
        request_counts=counts,
        errors=errors,
        output_file_id=fields.get("output_file_id"),
        error_file_id=fields.get("error_file_id"),
        in_progress_at=_int(fields, "in_progress_at"),
        expires_at=_int(fields, "expires_at"),
        finalizing_at=ended if status in ("completed",) else None,
        completed_at=ended if status == "completed" else None,
        failed_at=_int(fields, "failed_at"),
        expired_at=ended if status == "expired" else None,
        cancelling_at=_int(fields, "cancelling_at"),
        cancelled_at=ended if status == "cancelled" else None,
        metadata=msgspec.json.decode(fields["metadata"]) if fields.get("metadata") else None,
    )


def _status(job: JobStatus | None, fields: dict[str, str]) -> str:
    if job is None:
        return "failed"
    if job.status in ("queued", "running"):
        return "in_progress"
    return job.status  # cancelling, cancelled, completed, expired: OpenAI's names too


async def _finalize(store: BatchStore, runtime: Runtime, fields: dict[str, str], job: JobStatus) -> None:
    """Write the batch's output and error files from its job's result lines, once."""
    batch_id, owner, job_id = fields["id"], fields.get("owner", ""), fields["job_id"]
    strict = fields.get("strict", "")
    ok: list[bytes] = []
    failed: list[bytes] = []
    offset = 0
    while offset < job.counts.total:
        page = await runtime.bulk.results(job_id, offset, RESULTS_SLICE, owner=owner or None)
        if not page:
            break
        for raw in page:
            stored = msgspec.json.decode(raw, type=lines.Stored)
            line, good = _rendered(batch_id, stored, strict, job.status)
            (ok if good else failed).append(line)
        offset += len(page)
    output = b"".join(line + b"\n" for line in ok)
    errors = b"".join(line + b"\n" for line in failed)
    out = await store.put_file(
        owner=owner, filename=f"{batch_id}_output.jsonl", purpose="batch_output", content=output
    )
    err = await store.put_file(
        owner=owner, filename=f"{batch_id}_error.jsonl", purpose="batch_output", content=errors
    )
    finished = int(job.finished_at or job.expires_at or 0)
    await store.note(
        batch_id,
        {
            "output_file_id": out["id"],
            "error_file_id": err["id"],
            "completed": len(ok),
            "failed": len(failed),
            "finalizing_at": finished,
        },
    )


class _Items(msgspec.Struct):
    index: int
    error: str | None = None
    message: str | None = None


class _Embedded(msgspec.Struct):
    data: list[_Items]


def _rendered(batch_id: str, stored: lines.Stored, strict: str, job_status: str) -> tuple[bytes, bool]:
    """The output (True) or error (False) line of one stored result."""
    index, custom_id = stored.index, stored.custom_id or ""
    if len(stored.response) and stored.error is None:
        body = bytes(stored.response)
        if strict[index : index + 1] == "1":
            for item in msgspec.json.decode(body, type=_Embedded).data:
                if item.error is not None:
                    exc = item_failure("input", item.index, item.error, item.message)
                    return _error_line(batch_id, custom_id, index, exc), False
        return lines.output_line(batch_id, custom_id, index, 200, body), True
    error = stored.error or {}
    code, message = str(error.get("code", "internal_error")), str(error.get("message", ""))
    if code == "cancelled":
        unanswered = "batch_expired" if job_status == "expired" else "batch_cancelled"
        return lines.unanswered_line(batch_id, custom_id, index, unanswered, message), False
    exc = _BY_CODE[code](message) if code in _BY_CODE else item_failure("body", 0, code, message)
    exc.message = message
    return _error_line(batch_id, custom_id, index, exc), False


# A request's own error codes, as the error classes answer them (the rest are an item's).
_BY_CODE: dict[str, type[SrunError]] = {
    cls.code: cls
    for cls in (InvalidRequest, ModelNotFound, RequestTooLarge, UnsupportedSurface, Overloaded, Unavailable)
}


def _error_line(batch_id: str, custom_id: str, index: int, exc: SrunError) -> bytes:
    """The error the same request gets interactively (/v1/* answers upstream's codes)."""
    code = upstream_code(exc.code, exc.status)
    body = ErrorResponse(
        ErrorBody(code=code, message=exc.message, type=error_type(exc.status), param=exc.param)
    )
    return lines.output_line(batch_id, custom_id, index, exc.status, msgspec.json.encode(body))


@get("/v1/batches/{batch_id:str}", summary="A batch (OpenAI-compatible)")
async def retrieve_batch(batch_id: FromPath[str], state: State) -> Batch:
    runtime: Runtime = state.runtime
    store = store_of(runtime)
    return await _batch(store, runtime, await store.batch(batch_id, owner=owner_of(runtime) or ""))


@post("/v1/batches/{batch_id:str}/cancel", summary="Cancel a batch (OpenAI-compatible)", status_code=200)
async def cancel_batch(batch_id: FromPath[str], state: State) -> Batch:
    runtime: Runtime = state.runtime
    store = store_of(runtime)
    owner = owner_of(runtime) or ""
    fields = await store.batch(batch_id, owner=owner)
    if fields.get("job_id"):
        job = await runtime.bulk.cancel(fields["job_id"], owner=owner or None)
        if job.status in ("cancelling", "cancelled"):
            await store.note(batch_id, {"cancelling_at": _now()})
        fields = await store.batch(batch_id, owner=owner)
    return await _batch(store, runtime, fields)


@get("/v1/batches", summary="List your batches (OpenAI-compatible)")
async def list_batches(
    state: State,
    after: Annotated[str | None, QueryParameter(name="after")] = None,
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=100)] = 20,
) -> BatchList:
    runtime: Runtime = state.runtime
    store = store_of(runtime)
    owner = owner_of(runtime) or ""
    ids, more = await store.listed("batch", owner=owner, after=after, limit=limit)
    found = []
    for batch_id in ids:
        try:
            found.append(await _batch(store, runtime, await store.batch(batch_id, owner=owner)))
        except SrunError:  # expired since it was listed
            continue
    return BatchList(
        data=found,
        has_more=more,
        first_id=found[0].id if found else None,
        last_id=found[-1].id if found else None,
    )


BATCH_ROUTES = [
    _options("/v1/batches", "GET, OPTIONS, POST"),
    create_batch,
    retrieve_batch,
    cancel_batch,
    list_batches,
]

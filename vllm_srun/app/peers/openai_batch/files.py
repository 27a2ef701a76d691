"""OpenAI's files: POST /v1/files (multipart, purpose=batch), GET /v1/files, GET and DELETE
/v1/files/{id}, GET /v1/files/{id}/content. A file is its caller's; its bytes and lines are
bounded as a job's are (--max-job-bytes, --max-job-requests), and it expires with the job TTL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Response, delete, get, post, route
from litestar.datastructures import State, UploadFile
from litestar.enums import HttpMethod, MediaType, RequestEncodingType
from litestar.params import Body, FromPath, QueryParameter

from vllm_srun.app.runtime import Runtime
from vllm_srun.app.service.jobs import owner_of
from vllm_srun.errors import RequestTooLarge
from vllm_srun.queue.jobs.batches import BatchStore


class FileObject(msgspec.Struct):
    """OpenAI's File object."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int
    object: Literal["file"] = "file"
    status: str = "processed"


class FileList(msgspec.Struct):
    data: list[FileObject]
    has_more: bool
    object: Literal["list"] = "list"


class FileDeleted(msgspec.Struct):
    id: str
    deleted: bool
    object: Literal["file"] = "file"


def store_of(runtime: Runtime) -> BatchStore:
    return BatchStore(runtime.bulk.redis, ttl_s=runtime.bulk.ttl_s)


def file_object(fields: dict[str, str]) -> FileObject:
    return FileObject(
        id=fields["id"],
        bytes=int(fields["bytes"]),
        created_at=int(fields["created_at"]),
        filename=fields["filename"],
        purpose=fields["purpose"],
        expires_at=int(fields["expires_at"]),
    )


@dataclass
class FileUpload:
    """OpenAI's upload form: the file, and `purpose` (only "batch" here)."""

    file: UploadFile
    purpose: Literal["batch"]


async def upload(
    data: Annotated[FileUpload, Body(media_type=RequestEncodingType.MULTI_PART)], state: State
) -> FileObject:
    runtime: Runtime = state.runtime
    upload, purpose = data.file, data.purpose
    content = await upload.read()
    most = runtime.settings.max_job_requests
    if sum(1 for line in content.splitlines() if line.strip()) > most:
        raise RequestTooLarge(f"file: more than {most} lines (--max-job-requests)", param="file")
    fields = await store_of(runtime).put_file(
        owner=owner_of(runtime) or "",
        filename=upload.filename or "upload.jsonl",
        purpose=purpose,
        content=content,
    )
    return file_object(fields)


@get("/v1/files", summary="List your files (OpenAI-compatible)")
async def list_files(
    state: State,
    after: Annotated[str | None, QueryParameter(name="after")] = None,
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=10_000)] = 10_000,
) -> FileList:
    runtime: Runtime = state.runtime
    store, owner = store_of(runtime), owner_of(runtime) or ""
    ids, more = await store.listed("file", owner=owner, after=after, limit=limit)
    found = []
    for file_id in ids:
        try:
            found.append(file_object(await store.file(file_id, owner=owner)))
        except Exception:  # expired since it was listed
            continue
    return FileList(data=found, has_more=more)


@get("/v1/files/{file_id:str}", summary="A file (OpenAI-compatible)")
async def retrieve_file(file_id: FromPath[str], state: State) -> FileObject:
    runtime: Runtime = state.runtime
    return file_object(await store_of(runtime).file(file_id, owner=owner_of(runtime) or ""))


@get(
    "/v1/files/{file_id:str}/content",
    summary="A file's bytes (OpenAI-compatible)",
    media_type="application/jsonl",
)
async def file_content(file_id: FromPath[str], state: State) -> Response[bytes]:
    runtime: Runtime = state.runtime
    store = store_of(runtime)
    await store.file(file_id, owner=owner_of(runtime) or "")
    return Response(await store.content(file_id), media_type="application/jsonl")


@delete("/v1/files/{file_id:str}", summary="Delete a file (OpenAI-compatible)", status_code=200)
async def delete_file(file_id: FromPath[str], state: State) -> FileDeleted:
    runtime: Runtime = state.runtime
    await store_of(runtime).delete_file(file_id, owner=owner_of(runtime) or "")
    return FileDeleted(id=file_id, deleted=True)


def file_routes(max_job_bytes: int) -> list[Any]:
    """The file routes; an upload takes up to `max_job_bytes` (a job's own bound)."""
    create = post(
        "/v1/files",
        summary="Upload a batch input file (OpenAI-compatible)",
        status_code=200,
        request_max_body_size=max_job_bytes,
    )(upload)
    return [files_options, file_options, create, list_files, retrieve_file, file_content, delete_file]


def _options(path: str, allow: str) -> Any:
    """OPTIONS naming every method of `path`: Litestar answers it from the first handler
    registered at a path, and each method here is a handler of its own."""

    async def answer() -> Response[None]:
        return Response(None, status_code=204, headers={"Allow": allow}, media_type=MediaType.TEXT)

    name = "Options" + path.replace("/", "_").replace("{", "").replace("}", "").replace(":str", "")
    return route(path, http_method=[HttpMethod.OPTIONS], include_in_schema=False, name=name)(answer)


files_options = _options("/v1/files", "GET, OPTIONS, POST")
file_options = _options("/v1/files/{file_id:str}", "DELETE, GET, OPTIONS")

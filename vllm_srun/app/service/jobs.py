"""Bulk jobs over HTTP: create, status, results, events (SSE), cancel.

A job is created from JSON (`{"surface", "model", "requests": [...], "on_error"}`) or JSONL
(`application/x-ndjson`, one surface request per line). Every line is validated before anything
is queued: `on_error=reject` (the default) refuses the job naming the bad line, `record` makes
it that item's error. With API keys a job is its caller's (another caller gets 404), and event
streams are capped per replica and per caller (429 past either).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema
from litestar.params import FromPath, HeaderParameter, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from vllm_srun.app import embedding_types as quantization
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.tenants import CALLER, Caller
from vllm_srun.errors import InvalidRequest, RequestTooLarge, Unauthorized, UnsupportedSurface
from vllm_srun.plugins.surfaces import REGISTRY, Surface, request_type
from vllm_srun.queue.jobs import JobStatus, error_body

OnError = Literal["reject", "record"]
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")
MAX_CUSTOM_ID = 256
# A results page holds at most `limit` results and about this many bytes (at least one
# result), so a page's size is bounded whatever `limit` asks; `has_more` says what is left.
RESULTS_PAGE_BYTES = 16 * 1024 * 1024
# A Redis stream id, as the events stream sends them ("1700000000000-0"; the sequence optional).
# A Redis stream id is two unsigned 64-bit numbers: 19 digits always fit (20 may not, and
# Redis would refuse it once the stream has begun).
EVENT_ID = re.compile(r"[0-9]{1,19}(-[0-9]{1,19})?")
# What msgspec raises on bytes that are not UTF-8, or on JSON nested deeper than it recurses.
BAD_JSON = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


# The surfaces bulk jobs take, as the document lists them (`REGISTRY.for_jobs` refuses others).
JOB_SURFACES = [surface.name for surface in REGISTRY if surface.bulk]


class JobRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A bulk job: `requests` are bodies of `surface`'s route, except that a job answers float
    vectors, so an embeddings request with a quantized `options.embedding_type` is refused."""

    surface: Annotated[str, msgspec.Meta(extra_json_schema={"enum": JOB_SURFACES})]
    requests: list[dict[str, Any]]
    model: str | None = None
    on_error: OnError | None = None  # None: the query's on_error (default reject)


@dataclass
class CreateJobOperation(Operation):
    """POST /v1/jobs reads its body itself (JSON or JSONL, by content type), so Litestar sees no
    body to document; this documents both: the JSON body is `JobRequest`'s own schema, as
    msgspec (which decodes it) writes it, and JSONL is one surface request per line."""

    def __post_init__(self) -> None:
        (job,), components = msgspec.json.schema_components([JobRequest])
        content = {"application/json": OpenAPIMediaType(schema=components[job["$ref"].rpartition("/")[2]])}
        # Its other names (application/jsonl, application/json-lines) are taken the same way.
        content[NDJSON_TYPES[0]] = OpenAPIMediaType(
            schema=Schema(type=OpenAPIType.STRING, description="One surface request (a JSON object) per line")
        )
        # Each surface's requests are that surface's request bodies: one variant per surface.
        content["application/json"].schema["oneOf"] = [  # type: ignore[index]
            {
                "properties": {
                    "surface": {"const": name},
                    "requests": {"items": {"$ref": f"#/components/schemas/{request_type(name).__name__}"}},
                }
            }
            for name in JOB_SURFACES
        ]
        self.request_body = RequestBody(content=content, required=True)


class JobResults(msgspec.Struct):
    """A page of a job's results as JSON (`job_results` writes it from the stored lines)."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    offset: int
    total: int
    has_more: bool


_AT_PATH = re.compile(r"(?s)(.*) - at `\$\.?(.+)`")


def _field_first(exc: Exception) -> str:
    """msgspec's "Expected … - at `$.input`" as the surfaces say it: "input: Expected …"."""
    message = getattr(exc, "message", None) or str(exc)
    match = _AT_PATH.fullmatch(message)
    return f"{match[2]}: {match[1]}" if match else message


def caller_of(runtime: Runtime) -> Caller | None:
    """The request's caller (None: the server takes no key, and every job is everyone's)."""
    caller = CALLER.get()
    if caller is None and runtime.callers:  # the guard identifies every caller of these routes
        raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")
    return caller


def owner_of(runtime: Runtime) -> str | None:
    caller = caller_of(runtime)
    return caller.id if caller is not None else None


# JSONL lines handed to the validating thread at a time: large enough that the hand-off costs
# nothing beside the work, small enough that a job's lines never pile up undecoded.
LINES_PER_BATCH = 4096


def _decoded(numbered: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value or the decode error) of each non-blank line, one at a time."""
    for number, line in numbered:
        if not line.strip():
            continue
        try:
            yield number, msgspec.json.decode(line)
        except BAD_JSON as exc:
            yield number, exc


async def _jsonl_job(request: Request[Any, Any, Any], digest: Any, validator: Validator) -> None:
    """Read a JSONL body as it arrives, never whole: complete lines go to `validator` in batches
    on a thread (so the event loop keeps answering), each line decoded, validated and kept as
    bytes before the next; the body's bytes go into `digest`. The route's body limit is enforced
    on the bytes read (413)."""
    pending = b""
    number = 0
    batch: list[tuple[int, bytes]] = []
    first = True
    async for chunk in request.stream():
        digest.update(chunk)
        if first and chunk:
            # A UTF-8 byte-order mark (editors on Windows write one) is not part of line 1.
            chunk, first = chunk.removeprefix(b"\xef\xbb\xbf"), False
        pending += chunk
        cut = pending.rfind(b"\n")
        if cut < 0:
            continue
        complete, pending = pending[: cut + 1], pending[cut + 1 :]
        for line in complete.splitlines():
            number += 1
            batch.append((number, line))
        if len(batch) >= LINES_PER_BATCH:
            await asyncio.to_thread(validator.feed, _decoded(batch))
            batch = []
    for line in pending.splitlines():
        number += 1
        batch.append((number, line))
    if batch:
        await asyncio.to_thread(validator.feed, _decoded(batch))


class Validator:
    """Validates a job's entries as they come, keeping each as the bytes it is stored as
    (request JSON, custom ids, recorded errors by index): a bad entry raises under
    on_error=reject, and one past --max-job-requests is a RequestTooLarge."""

    def __init__(
        self, runtime: Runtime, surface: Surface[Any], model: str, on_error: OnError, unit: str
    ) -> None:
        self.runtime, self.surface, self.model = runtime, surface, model
        self.on_error, self.unit = on_error, unit
        self.requests: list[bytes] = []
        self.custom_ids: list[str] = []
        self.errors: dict[int, bytes] = {}

    def feed(self, entries: Iterable[tuple[int, Any]]) -> None:
        runtime, surface, model, errors = self.runtime, self.surface, self.model, self.errors
        on_error, unit = self.on_error, self.unit
        most = runtime.settings.max_job_requests
        for number, value in entries:
            index = len(self.requests)
            if index >= most:
                raise RequestTooLarge(f"requests: more than {most} per job (--max-job-requests)")
            custom_id = ""
            try:
                if isinstance(value, Exception):
                    raise InvalidRequest(f"not JSON: {value}")
                if not isinstance(value, dict):
                    raise InvalidRequest("must be a JSON object (a surface request)")
                custom_id = value.pop("custom_id", None)
                if custom_id is None:
                    custom_id = ""
                if not isinstance(custom_id, str) or len(custom_id) > MAX_CUSTOM_ID:
                    custom_id = ""
                    raise InvalidRequest(f"custom_id: a string of at most {MAX_CUSTOM_ID} characters")
                if value.get("model") not in (None, model):
                    raise InvalidRequest(f"model: {value['model']!r} differs from the job's model {model!r}")
                # As strictly as the surface endpoints decode their bodies: the document's types.
                request = surface.decode(value)
                surface.check_options(request.options)
                refuse_quantized(request)
                count, field = surface.count(request), surface.counted_field
                if count == 0:
                    raise InvalidRequest(f"{field}: must not be empty")
                if count > runtime.settings.max_inputs:
                    raise InvalidRequest(
                        f"{field}: more than {runtime.settings.max_inputs} {field} (--max-inputs)"
                    )
                value = request  # stored as decoded
            except (InvalidRequest, msgspec.ValidationError) as exc:
                message = f"{unit} {number}: {_field_first(exc)}"
                if on_error == "reject":
                    raise InvalidRequest(message) from exc
                errors[index] = error_body("invalid_request", message)
                value = {}
            self.requests.append(msgspec.json.encode(value))
            self.custom_ids.append(custom_id)


def refuse_quantized(request: Any) -> None:
    """A job's results are the surface's float vectors: its runner quantizes nothing, so a
    request for a quantized embedding type is refused rather than answered in floats."""
    if quantization.asked(request) is not None:
        raise InvalidRequest(
            f"{quantization.FIELD}: jobs answer float vectors; quantized types are served on /v1/embeddings",
            param=quantization.FIELD,
        )


async def create_job(
    request: Request[Any, Any, Any],
    state: State,
    surface: Annotated[
        str | None, QueryParameter(name="surface", schema_extra={"enum": JOB_SURFACES})
    ] = None,
    model: Annotated[str | None, QueryParameter(name="model")] = None,
    on_error: Annotated[OnError, QueryParameter(name="on_error")] = "reject",
    idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key")] = None,
) -> Response[JobStatus]:
    runtime: Runtime = state.runtime
    if surface is not None:
        REGISTRY.for_jobs(surface)  # as documented, even where a JSON body names its own
    caller = caller_of(runtime)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    jsonl = content_type in NDJSON_TYPES
    job: JobRequest | None = None
    body = b""
    if not jsonl:
        body = await request.body()
        try:
            job = msgspec.json.decode(body, type=JobRequest)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(
                f"{exc} (a JSON body is {{surface, model, requests, on_error}}; "
                f"send JSONL as {NDJSON_TYPES[0]})"
            ) from exc
        except BAD_JSON as exc:
            raise InvalidRequest(f"body: not JSON: {exc}") from exc
        surface, model, on_error = job.surface, job.model, job.on_error or on_error
    if surface is None:
        raise InvalidRequest("surface: required (a query parameter for JSONL bodies)")
    # An unknown surface, or one bulk jobs do not take, is a bad request whatever the model serves.
    described = REGISTRY.for_jobs(surface)
    _, loaded = runtime.model_for(model)
    name = loaded.info.name
    if surface not in loaded.info.surfaces:
        raise UnsupportedSurface(f"model {name!r} does not serve {surface}")
    # What an Idempotency-Key is bound to: the same key with another request is a 422.
    digest = hashlib.sha256(b"%s\n%s\n%s\n" % (surface.encode(), name.encode(), on_error.encode()))
    validator = Validator(runtime, described, name, on_error, "line" if jsonl else "requests item")
    # Off the event loop: a large job takes seconds to validate, and /health/live and every
    # other request must keep answering meanwhile (the GIL is handed back between lines).
    if jsonl:
        await _jsonl_job(request, digest, validator)
    else:
        assert job is not None
        digest.update(body)
        await asyncio.to_thread(validator.feed, enumerate(job.requests))
    requests, custom_ids, errors = validator.requests, validator.custom_ids, validator.errors
    status, created = await runtime.bulk.create(
        deployment=name,
        surface=surface,
        requests=requests,
        custom_ids=custom_ids,
        errors=errors,
        idempotency_key=idempotency_key,
        request_digest=digest.hexdigest() if idempotency_key else "",
        owner=caller.id if caller is not None else "",
        cache_salt=caller.cache_salt if caller is not None else "",
    )
    return Response(status, status_code=202 if created else 200)


@get("/v1/jobs/{job_id:str}", summary="A job's status and counts")
async def job_status(job_id: FromPath[str], state: State) -> JobStatus:
    runtime: Runtime = state.runtime
    return await runtime.bulk.get(job_id, owner=owner_of(runtime))


@post("/v1/jobs/{job_id:str}/cancel", summary="Cancel a job", status_code=200)
async def cancel_job(job_id: FromPath[str], state: State) -> JobStatus:
    runtime: Runtime = state.runtime
    return await runtime.bulk.cancel(job_id, owner=owner_of(runtime))


@get(
    "/v1/jobs/{job_id:str}/results",
    summary="Results in input order (JSON, or JSONL by Accept)",
    responses={200: ResponseSpec(JobResults, description="A page of results", generate_examples=False)},
)
async def job_results(
    job_id: FromPath[str],
    request: Request[Any, Any, Any],
    state: State,
    offset: Annotated[int, QueryParameter(name="offset", ge=0)] = 0,
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=100_000)] = 1000,
) -> Response[bytes]:
    runtime: Runtime = state.runtime
    owner = owner_of(runtime)
    job = await runtime.bulk.get(job_id, owner=owner)
    lines = await runtime.bulk.results(job_id, offset, limit, owner=owner, max_bytes=RESULTS_PAGE_BYTES)
    accept = request.headers.get("accept", "")
    if any(kind in accept for kind in NDJSON_TYPES):
        return Response(b"".join(line + b"\n" for line in lines), media_type="application/x-ndjson")
    has_more = offset + len(lines) < job.counts.total
    body = b'{"object":"list","data":[%s],"offset":%d,"total":%d,"has_more":%s}' % (
        b",".join(lines),
        offset,
        job.counts.total,
        b"true" if has_more else b"false",
    )
    return Response(body, media_type="application/json")


@get(
    "/v1/jobs/{job_id:str}/events",
    summary="Server-Sent Events: progress, results, final status",
    media_type="text/event-stream",
)
async def job_events(
    job_id: FromPath[str],
    request: Request[Any, Any, Any],
    state: State,
    # The pattern is documented and checked here, so a malformed id gets this route's message. A
    # plain string, not nullable: a header has no null (a client would send the text "null"). An
    # absent header starts the stream at its beginning; an empty one is no event id.
    last_event_id: Annotated[
        str,
        HeaderParameter(
            name="Last-Event-ID",
            required=False,
            schema_extra={"pattern": f"^{EVENT_ID.pattern}$"},
        ),
    ] = "",
) -> ServerSentEvent:
    runtime: Runtime = state.runtime
    if "last-event-id" in request.headers and not EVENT_ID.fullmatch(last_event_id):
        raise InvalidRequest(
            f"Last-Event-ID: {last_event_id[:64]!r} is not an event id of this stream (e.g. 1700000000000-0)"
        )
    caller = caller_of(runtime)
    owner = caller.id if caller is not None else None
    # Keyless, a caller is its address (behind `vllm-srun proxy`, the proxy's: one caller).
    slot = runtime.streams.take(owner or f"address:{request.client.host if request.client else ''}")
    try:
        await runtime.bulk.get(job_id, owner=owner)  # 404 before the stream starts
    except BaseException:
        slot.release()
        raise
    events = runtime.bulk.events(job_id, last_event_id or "0-0", owner=owner)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        try:
            async for event_id, event, data in events:
                if not event:
                    yield ServerSentEventMessage(data=None, comment="keep-alive")
                    continue
                yield ServerSentEventMessage(data=data.decode(), event=event, id=event_id)
        finally:
            slot.release()
            await events.aclose()

    iterator = stream()
    # A stream dropped before its first event never runs its `finally`: the slot goes back when
    # the iterator is collected.
    weakref.finalize(iterator, slot.release)
    return ServerSentEvent(iterator)


def job_routes(max_job_bytes: int) -> list[Any]:
    """The job routes; creation takes bodies up to `max_job_bytes` (other routes keep theirs)."""
    create = post(
        "/v1/jobs",
        summary="Create a bulk job (JSON or JSONL)",
        status_code=202,
        request_max_body_size=max_job_bytes,
        operation_class=CreateJobOperation,
        responses={
            200: ResponseSpec(
                JobStatus,
                description="The job an earlier request with this Idempotency-Key created",
                generate_examples=False,
            )
        },
    )(create_job)
    return [create, job_status, cancel_job, job_results, job_events]

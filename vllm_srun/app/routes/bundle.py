"""POST /v1/bundle (the upstream runtime's contract, 2.3.0): the work of several surfaces, for one
model or several, in one call. Each task is decoded by its surface's descriptor and served as
that surface's own route serves it, all at once, so tasks for one model share its batches; each
is answered with the status and body it would have had alone. Only the bundle's own faults
refuse it whole; its tasks' inputs count together against `--max-inputs`, and it holds one slot.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

import msgspec
import structlog
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.errors import ErrorBody, error_type, upstream_code
from vllm_srun.app.peers.failures import no_null_vectors
from vllm_srun.app.responses import client_closed, encoded, timing_of, unless_disconnected
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import Timing, request_slot, serve_surface
from vllm_srun.errors import InvalidRequest, RequestTooLarge, SrunError, model_failure
from vllm_srun.plugins.decision_bodies import DecisionResponse
from vllm_srun.plugins.surfaces import (
    REGISTRY,
    ClassifyResponse,
    EmbeddingsResponse,
    RerankResponse,
)

log = structlog.get_logger("vllm_srun.app")

# The surface fields of a task, in the contract's order.
SURFACE_FIELDS = ("decisions", "classify", "embeddings", "rerank")


def _body(surface: str) -> Any:
    """A task's surface field: that surface's request, as any JSON value the task decodes itself
    (so a malformed one, or one that is not an object, fails its task alone); documented as the
    surface's request."""
    name = REGISTRY.get(surface).request_type.__name__
    # Any value is taken here, and one the request's schema refuses is answered in the task's own
    # result (its status 400), not by refusing the bundle: the document says both.
    schema = {
        "anyOf": [{"$ref": f"#/components/schemas/{name}"}, {}],
        "description": f"A {name}; a body that is not one fails this task alone (its result's status 400)",
    }
    return Annotated[Any, msgspec.Meta(extra_json_schema=schema)]


class BundleOptions(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    # Applies to every task unless a task's own deadline is earlier.
    deadline_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None


class BundleTask(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One task: an id unique in the bundle, and exactly one surface field."""

    # The document says "exactly one": `oneOf` a schema requiring each (vllm_srun.app.schemas).
    one_of_required: ClassVar[tuple[str, ...]] = SURFACE_FIELDS

    id: Annotated[str, msgspec.Meta(min_length=1)]
    # UNSET, not None: a field given as null is a task (whose body fails it), as the document's
    # "exactly one present" reads it.
    decisions: _body("decisions") = msgspec.UNSET  # type: ignore[valid-type]
    classify: _body("classify") = msgspec.UNSET  # type: ignore[valid-type]
    embeddings: _body("embeddings") = msgspec.UNSET  # type: ignore[valid-type]
    rerank: _body("rerank") = msgspec.UNSET  # type: ignore[valid-type]

    def surface(self, index: int) -> tuple[str, Any]:
        """The task's one surface field and its body; an InvalidRequest naming `tasks[index]`
        when it sets none or several."""
        given = [
            (name, value) for name in SURFACE_FIELDS if (value := getattr(self, name)) is not msgspec.UNSET
        ]
        if len(given) != 1:
            found = ", ".join(name for name, _ in given) or "none"
            raise InvalidRequest(
                f"tasks[{index}]: a task sets exactly one of {', '.join(SURFACE_FIELDS)}; it sets {found}",
                param=f"tasks[{index}]",
            )
        return given[0]


class BundleRequest(msgspec.Struct, forbid_unknown_fields=True):
    tasks: Annotated[list[BundleTask], msgspec.Meta(min_length=1)]
    options: BundleOptions = msgspec.field(default_factory=BundleOptions)


class BundleResult(msgspec.Struct, omit_defaults=True):
    """One task's result: on status 200 its surface field holds the response, otherwise
    `error` says why, as the task's own route would have."""

    id: str
    status: int
    decisions: DecisionResponse | None = None
    classify: ClassifyResponse | None = None
    embeddings: EmbeddingsResponse | None = None
    rerank: RerankResponse | None = None
    error: ErrorBody | None = None


class BundleResponse(msgspec.Struct):
    results: list[BundleResult]


def _embeddings_shape(request: Any, body: Any) -> Any:
    # As POST /v1/embeddings: without per-item errors asked for, a failed input fails the task.
    return body if request.options.overflow is not None else no_null_vectors(body)


# What a surface's own route does to the surface's response before sending it.
ROUTE_SHAPES: dict[str, Callable[[Any, Any], Any]] = {"embeddings": _embeddings_shape}


def check(data: BundleRequest, max_tasks: int) -> list[tuple[str, Any]]:
    """Each task's surface and body; a RequestTooLarge past `max_tasks`, an InvalidRequest
    for a task without exactly one surface or with an id an earlier task has."""
    if len(data.tasks) > max_tasks:
        raise RequestTooLarge(
            f"tasks: {len(data.tasks)} tasks; at most {max_tasks} per bundle (limits.max_bundle_tasks)",
            param="tasks",
        )
    first: dict[str, int] = {}
    for index, task in enumerate(data.tasks):
        if task.id in first:
            raise InvalidRequest(
                f"tasks[{index}].id: {task.id!r} is also the id of tasks[{first[task.id]}]",
                param=f"tasks[{index}].id",
            )
        first[task.id] = index
    return [task.surface(index) for index, task in enumerate(data.tasks)]


def _failed(task_id: str, exc: SrunError) -> BundleResult:
    # As the task's own route answers it: in upstream's ErrorBody codes.
    code = upstream_code(exc.code, exc.status)
    error = ErrorBody(code=code, message=exc.message, type=error_type(exc.status), param=exc.param)
    return BundleResult(id=task_id, status=exc.status, error=error)


# msgspec ends a decode error's text with the field it fails at: " - at `$.input[1]`".
_AT = re.compile(r" - at `\$\.(.+)`$")


def _decode(surface: str, value: Any) -> Any:
    """The task's request; a decode error in the words, code and param the surface's own route
    gives it (errors.handle_http_error on Litestar's decode errors): the field as the body names
    it (`input[1]`), or `body` when the value itself is wrong."""
    try:
        return REGISTRY.get(surface).decode(value)
    except msgspec.ValidationError as exc:
        text = str(exc)
        at = _AT.search(text)
        message = text[: at.start()] if at else text.split(" - ", 1)[0]
        field = at.group(1) if at else None
        if field is not None and message.startswith("Object contains unknown field `"):
            field = f"{field}.{message.split('`')[1]}"  # the option named, as the route names it
        if field is None:
            whole = InvalidRequest(f"body: {message}")
            whole.param = None  # as the route: `body` is no field of the request
            raise whole from None
        raise InvalidRequest(message if field in message else f"{field}: {message}", param=field) from None


def decode_all(surfaces: list[tuple[str, Any]], max_inputs: int) -> list[Any]:
    """Each task's request, or the SrunError that answers its task alone; a RequestTooLarge
    for the whole bundle when the tasks' inputs together pass `max_inputs` (a bundle is one
    request: split across tasks, inputs would otherwise pass the bound by max_bundle_tasks
    times)."""
    decoded: list[Any] = []
    for surface, value in surfaces:
        try:
            decoded.append(_decode(surface, value))
        except SrunError as exc:
            decoded.append(exc)
    total = sum(
        REGISTRY.get(surface).count(request)
        for (surface, _), request in zip(surfaces, decoded, strict=True)
        if not isinstance(request, SrunError)
    )
    if total > max_inputs:
        raise RequestTooLarge(
            f"tasks: {total} inputs in all; at most {max_inputs} per request, a bundle's tasks "
            "together (--max-inputs)",
            param="tasks",
        )
    return decoded


async def run_task(
    runtime: Runtime,
    task_id: str,
    surface: str,
    request: Any,
    deadline_ms: float | None,
    timing: Timing,
) -> BundleResult:
    """One task, answered as its own route would answer it (never raising but for cancellation).
    `request` is the task's decoded request, or the SrunError its decoding raised."""
    try:
        if isinstance(request, SrunError):
            raise request
        body = await serve_surface(
            runtime, REGISTRY.get(surface), request, timing, deadline_ms=deadline_ms, slot=False
        )
        shape = ROUTE_SHAPES.get(surface)
        return BundleResult(
            id=task_id, status=200, **{surface: body if shape is None else shape(request, body)}
        )
    except SrunError as exc:
        return _failed(task_id, exc)
    except Exception as exc:  # one task's failure is its own 500, never the others'
        if not model_failure(exc):
            raise
        log.exception("bundle_task_failed", task=task_id, error_type=type(exc).__name__)
        return _failed(task_id, SrunError(f"{type(exc).__name__}: the server failed this task"))


@post(
    "/v1/bundle",
    status_code=200,
    summary="Serve several surface requests, for one or more models, in one call",
)
async def bundle(
    request: Request[Any, Any, Any], data: JSONBody[BundleRequest], state: State
) -> Response[BundleResponse]:
    timing = timing_of(request)
    runtime: Runtime = state.runtime
    request.scope["state"]["srun_model"] = ""
    surfaces = check(data, runtime.settings.max_bundle_tasks)
    requests = decode_all(surfaces, runtime.settings.max_inputs)
    timings = [Timing() for _ in data.tasks]
    finished: list[int] = []

    async def one(index: int) -> BundleResult:
        surface = surfaces[index][0]
        task = data.tasks[index]
        deadline_ms = data.options.deadline_ms
        result = await run_task(runtime, task.id, surface, requests[index], deadline_ms, timings[index])
        finished.append(index)
        return result

    async def every() -> list[BundleResult]:
        return list(await asyncio.gather(*(one(i) for i in range(len(data.tasks)))))

    with request_slot(runtime):
        done, results = await unless_disconnected(request, every())
    if not done or results is None:
        return client_closed()
    # The tasks tokenise one after another on the event loop: their sum. They wait and run
    # side by side: the queue, forward and post of the one answered last (as upstream says).
    timing.tokenize_s = sum(t.tokenize_s for t in timings)
    if finished:
        last = timings[finished[-1]]
        timing.queue_s, timing.forward_s, timing.post_s = last.queue_s, last.forward_s, last.post_s
    return encoded(BundleResponse(results=results), timing)

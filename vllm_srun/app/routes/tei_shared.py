"""What the TEI-shaped routes share: TEI's error body and status codes, its truncation fields,
and which served model a route without a `model` field reaches.

text-embeddings-inference answers errors as `{"error": ..., "error_type": ...}` with the status
of the error type (its router's `From<&ErrorType> for StatusCode`): `validation` 413 (too many
inputs, an input over the limit without truncation), `tokenizer` 422, `backend` 424 (the model
cannot do this, or its forward failed), `overloaded` 429, `unhealthy` 503, `empty` 400. Only
these routes answer in that shape (route-level `exception_handlers=TEI_ERRORS`); a body that
does not decode is a 422 `validation`, as TEI's JSON extractor answers it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException

from vllm_srun.app.errors import error_specs, handle_http_error
from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import (
    InvalidRequest,
    NotReady,
    Overloaded,
    RequestTooLarge,
    SrunError,
    Unavailable,
    UnsupportedSurface,
)
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import OVERFLOW_HINT, Options, OutputKind, Overflow
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, TokenIds

log = structlog.get_logger("vllm_srun.app")

ErrorType = Literal["validation", "tokenizer", "backend", "overloaded", "unhealthy", "empty"]
STATUS: dict[str, int] = {
    "validation": 413,
    "tokenizer": 422,
    "backend": 424,
    "overloaded": 429,
    "unhealthy": 503,
    "empty": 400,
}

# TEI's enum is "Left"/"Right"; huggingface_hub sends "left"/"right". Both mean the same.
Direction = Literal["Left", "Right", "left", "right"]


class TeiError(Exception):
    """An error answered in TEI's shape; `status` defaults to its type's."""

    def __init__(self, error_type: ErrorType, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status or STATUS[error_type]


class TeiErrorBody(msgspec.Struct):
    error: str
    error_type: str


# The statuses a TEI-shaped route answers with `TeiErrorBody`, and why (see the module docstring).
TEI_STATUSES = {
    400: "An empty batch (empty)",
    401: "An API key is required and was missing or wrong (validation)",
    404: "No such model (validation)",
    413: "Too many inputs, or an input over the limit without truncation (validation)",
    422: "The body does not decode, or its content is refused (validation, tokenizer)",
    424: "The model cannot do this, or its forward failed (backend)",
    429: "The queue is full (overloaded)",
    500: "The server failed this request (backend)",
    503: "The model is not ready (unhealthy)",
}
TEI_RESPONSES = error_specs(TeiErrorBody, TEI_STATUSES)


def _tei(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(
        TeiErrorBody(error=message, error_type=error_type),
        status_code=status,
        media_type=MediaType.JSON,
        headers=headers or {},
    )


def _srun_type(exc: SrunError) -> tuple[int, str]:
    if isinstance(exc, RequestTooLarge):
        return 413, "validation"
    if isinstance(exc, Overloaded):
        return 429, "overloaded"
    if isinstance(exc, (NotReady, Unavailable)):
        return 503, "unhealthy"
    if isinstance(exc, UnsupportedSurface):
        return 424, "backend"
    if isinstance(exc, InvalidRequest):
        # Our own checks of a request's content (a dimension too large, an unknown prompt):
        # unprocessable content, as TEI's extractor answers a body it cannot take.
        return 422, "validation"
    # 401, 404 and the rest keep their status; a 5xx is the backend's.
    return exc.status, "backend" if exc.status >= 500 else "validation"


def handle_tei_error(_: Request[Any, Any, Any], exc: TeiError) -> Response[Any]:
    return _tei(exc.status, exc.error_type, exc.message)


def handle_srun_error(_: Request[Any, Any, Any], exc: SrunError) -> Response[Any]:
    status, error_type = _srun_type(exc)
    return _tei(status, error_type, exc.message, exc.headers)


def handle_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """The app's own reading of the exception (its message names the field), in TEI's shape."""
    ours = handle_http_error(request, exc).content
    message = str(ours["error"]["message"]) if isinstance(ours, dict) else exc.detail
    if isinstance(exc, ValidationException):
        return _tei(422, "validation", message)
    status = exc.status_code
    return _tei(status, "validation" if status < 500 else "backend", message, dict(exc.headers or {}))


def handle_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled_error", error_type=type(exc).__name__)
    return _tei(500, "backend", f"{type(exc).__name__}: the server failed this request")


# Route-level handlers: the TEI routes answer every error in TEI's shape.
TEI_ERRORS: dict[Any, Any] = {
    TeiError: handle_tei_error,
    SrunError: handle_srun_error,
    HTTPException: handle_http_exception,
    Exception: handle_unexpected,
}


def options(runtime: Runtime, truncate: bool | None, direction: Direction) -> Options:
    """TEI's `truncate` and `truncation_direction` as the surfaces' options. An absent
    `truncate` is the server's `--auto-truncate`, as in TEI; without truncation an input over
    the limit is its own error, which these routes answer as TEI does (`raise_item_error`)."""
    auto = runtime.settings.auto_truncate if truncate is None else truncate
    overflow: Overflow = "truncate" if auto else "reject"
    return Options(overflow=overflow, truncation_direction="left" if direction.lower() == "left" else "right")


def raise_item_error(field: str, index: int, code: str, message: str | None) -> None:
    """One input's error (its `error` code and `message`) as TEI answers it: the whole request
    fails. An input over the limit is TEI's `validation` (413); anything else failed in the
    model (`backend`, 424)."""
    if code in ("max_length_exceeded", "scan_budget_exceeded"):
        # TEI's words for the way out: its body's `truncate`, not our options.
        raise TeiError(
            "validation", f"{field}[{index}]: {message}".replace(OVERFLOW_HINT, "(send truncate: true)")
        )
    raise TeiError("backend", f"{field}[{index}]: {code}: {message}")


def model_for(runtime: Runtime, surface: str | None) -> tuple[str, LoadedModel]:
    """The model a TEI route reaches (TEI serves one model; these routes name none): the only
    model served, else the only ready one serving `surface`."""
    if len(runtime.models) == 1 or surface is None:
        served, model = runtime.model_for(None)
        return served.name, model
    serving = [
        name
        for name, served in runtime.models.items()
        if served.model is not None and surface in served.model.info.surfaces
    ]
    if len(serving) != 1:
        raise TeiError(
            "validation",
            f"this route serves one model and {len(serving) or 'no'} served models serve {surface} "
            f"({', '.join(serving) or ', '.join(runtime.models)}); serve one model per TEI-shaped server",
            status=422,
        )
    served, model = runtime.model_for(serving[0])
    return served.name, model


# A bound the document states and the route checks itself, so that breaking it gets TEI's own
# answer (400 `empty`) rather than a decoding error: msgspec writes `extra_json_schema` into the
# schema (vllm_srun.app.schemas keeps it in the document) and never enforces it.
NON_EMPTY_LIST = msgspec.Meta(extra_json_schema={"minItems": 1})
NON_EMPTY_STR = msgspec.Meta(extra_json_schema={"minLength": 1})
# What TEI's embedding routes take: a text, or a batch of texts and token ids.
Inputs = Annotated[str, NON_EMPTY_STR] | Annotated[list[str | int | TokenIds], NON_EMPTY_LIST]


def check_batch(runtime: Runtime, count: int, field: str) -> None:
    if count == 0:
        raise TeiError("empty", f"`{field}` cannot be empty")
    limit = runtime.settings.max_inputs
    if count > limit:
        raise TeiError(
            "validation", f"batch size {count} > maximum allowed batch size {limit} (--max-inputs)"
        )


def embeddings_request(
    request: Request[Any, Any, Any],
    inputs: Inputs,
    truncate: bool | None,
    direction: Direction,
    prompt_name: str | None,
    output: OutputKind,
    *,
    dimensions: int | None = None,
) -> EmbeddingsRequest:
    """The embeddings request of TEI's embedding routes (/embed, /embed_sparse, /embed_all):
    `output` of `inputs`, on the model the route reaches, the batch checked against its limit."""
    runtime = request.app.state.runtime
    surface_options = options(runtime, truncate, direction)
    surface_options.output = output
    converted = EmbeddingsRequest(
        input=inputs if isinstance(inputs, str) else [*inputs],
        dimensions=dimensions,
        prompt_name=prompt_name,
        options=surface_options,
    )
    check_batch(runtime, len(converted.inputs()) if inputs else 0, "inputs")
    converted.model, _ = model_for(runtime, EMBEDDINGS.name)
    return converted

"""text-embeddings-inference's error body, `{"error", "error_type"}`, with the status of its type
(its router's `From<&ErrorType> for StatusCode`): `validation` 413, `tokenizer` 422, `backend`
424, `overloaded` 429, `unhealthy` 503, `empty` 400. Only the TEI-shaped routes answer in that
shape (route-level `exception_handlers=TEI_ERRORS`); a body that does not decode is a 422.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException

from vllm_srun.app.errors import error_specs, handle_http_error
from vllm_srun.app.peers.failures import OVER_LIMIT_CODES, item_failure
from vllm_srun.errors import (
    InvalidRequest,
    NotReady,
    Overloaded,
    RequestTooLarge,
    SrunError,
    Unavailable,
    UnsupportedSurface,
)
from vllm_srun.plugins.bodies import OVERFLOW_HINT

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


def in_tei_words(message: str) -> str:
    """`message` with the way out of an over-long input said in TEI's field, its body's `truncate`."""
    return message.replace(OVERFLOW_HINT, "(send truncate: true)")


def item_error(field: str, index: int, code: str, message: str | None) -> TeiError:
    """One input's error as TEI answers it (`peers.failures`, in TEI's body): an input over the
    limit is TEI's `validation` (413); anything else failed in the model (`backend`, 424)."""
    if code in OVER_LIMIT_CODES:
        return TeiError("validation", item_failure(field, index, code, message, words=in_tei_words).message)
    return TeiError("backend", f"{field}[{index}]: {code}: {message}")

"""The one place runtime errors become HTTP responses:
`{"error": {"code", "message", "type", "param"}}`.

`code` and `message` are the runtime's own (on the upstream runtime's routes, `code` is one of
its ErrorBody codes: see `upstream_code`); `type` and `param` are OpenAI's fields of those
names, so OpenAI clients raise their usual exception with `.param` set (`param` is null when
no one field is at fault).
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import ResponseSpec

from vllm_srun.errors import SrunError

log = structlog.get_logger("vllm_srun.app")

_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "invalid_request",
    429: "overloaded",
    503: "unavailable",
}


# OpenAI's error types by status; a status not listed is a client error below 500, else the server's.
_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


class ErrorBody(msgspec.Struct):
    """What went wrong (upstream's ErrorBody): the runtime's `code` and `message`, OpenAI's
    `type` and `param`."""

    code: str
    message: str
    type: str
    param: str | None


class ErrorResponse(msgspec.Struct):
    """Every error this app answers outside the TEI-shaped routes."""

    error: ErrorBody


# The statuses a route may answer with an error body, and why; the OpenAPI document lists
# them on every route (see `documented`), so a generated client knows the body of each.
ERROR_STATUSES = {
    400: "The request is malformed or fails validation (invalid_request)",
    401: "An API key is required and was missing or wrong (unauthorized)",
    404: "No such model or job (model_not_found, job_not_found, not_found)",
    413: "The body, or the number of inputs, is larger than allowed (request_too_large)",
    422: "The model does not serve this surface (unsupported_surface)",
    429: "The queue is full (overloaded); Retry-After says when to try again",
    500: "The server failed this request (internal_error)",
    503: "The model is not ready, or Redis is unavailable (not_ready, unavailable)",
}


def error_specs(body: type[Any], statuses: dict[int, str] = ERROR_STATUSES) -> dict[int, ResponseSpec]:
    """The OpenAPI response of each error status, each with `body` as its JSON schema."""
    return {
        status: ResponseSpec(body, description=description, generate_examples=False)
        for status, description in statuses.items()
    }


ERROR_RESPONSES = error_specs(ErrorResponse)


def error_type(status: int) -> str:
    """OpenAI's `type` for an error of this HTTP status."""
    return _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_response(
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    param: str | None = None,
) -> Response[Any]:
    body = ErrorResponse(ErrorBody(code=code, message=message, type=error_type(status), param=param))
    return Response(
        msgspec.to_builtins(body),
        status_code=status,
        media_type=MediaType.JSON,
        headers=headers or {},
    )


def _entries(exc: ValidationException) -> list[Any]:
    return exc.extra if isinstance(exc.extra, list) else []


def _validation_param(exc: ValidationException) -> str | None:
    """The one field a decode error names, as OpenAI writes it: `$.input[0]` is `input[0]`."""
    keys = {str(e["key"]) for e in _entries(exc) if isinstance(e, dict) and e.get("key")}
    if len(keys) != 1:
        return None
    key = keys.pop()
    key = key[2:] if key.startswith("$.") else key
    return None if key in ("", "$", "data") else key


def _validation_message(exc: ValidationException) -> str:
    """Litestar's decode errors name the field as `$.path`; keep that, drop the boilerplate."""
    parts = []
    for entry in _entries(exc):
        if isinstance(entry, dict) and entry.get("message"):
            key = entry.get("key")
            message = str(entry["message"])
            parts.append(f"{key}: {message}" if key and key not in message else message)
    return "; ".join(parts) or exc.detail


# The upstream runtime's routes (its OpenAPI 2.3.0): their errors' codes are its ErrorBody's.
UPSTREAM_PATHS = frozenset(
    {
        "/v1/classify",
        "/v1/embeddings",
        "/v1/rerank",
        "/v1/decisions",
        "/v1/systemone",
        "/v1/bundle",
        "/v1/models",
        "/health",
        "/health/live",
        "/metrics",
    }
)
UPSTREAM_ERROR_CODES = frozenset(
    {
        "invalid_request",
        "model_not_found",
        "request_too_large",
        "unsupported_surface",
        "overloaded",
        "internal_error",
        "not_ready",
    }
)
# A code of ours outside upstream's, by the status upstream documents it under: a lost Redis or
# a stopping server is a 503 as a model that is not ready is; the message still says which.
_UPSTREAM_BY_STATUS = {
    400: "invalid_request",
    404: "model_not_found",
    413: "request_too_large",
    422: "unsupported_surface",
    429: "overloaded",
    500: "internal_error",
    503: "not_ready",
}


def upstream_code(code: str, status: int) -> str:
    """`code` in upstream's ErrorBody vocabulary: itself when it is one, else the code of its
    status there. A status upstream does not document (401 under `--api-key`, 405) is ours, and
    keeps our code."""
    if code in UPSTREAM_ERROR_CODES:
        return code
    return _UPSTREAM_BY_STATUS.get(status, code)


def _code(request: Request[Any, Any, Any], code: str, status: int) -> str:
    return upstream_code(code, status) if request.url.path in UPSTREAM_PATHS else code


def handle_srun_error(request: Request[Any, Any, Any], exc: SrunError) -> Response[Any]:
    code = _code(request, exc.code, exc.status)
    return error_response(exc.status, code, exc.message, exc.headers, param=exc.param)


def handle_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    if isinstance(exc, ValidationException):
        message = _validation_message(exc)
        # Litestar names the body "data" (its handler parameter); an empty body is a KeyError.
        message = "body: a JSON object is required" if message == "'data'" else message
        message = "body:" + message[5:] if message.startswith("data:") else message
        return error_response(400, "invalid_request", message, param=_validation_param(exc))
    status = exc.status_code
    message = exc.detail
    if status == 413:
        message = f"the request body is larger than allowed (--max-request-bytes): {exc.detail}"
    code = _code(request, _HTTP_CODES.get(status, "http_error"), status)
    return error_response(status, code, message, dict(exc.headers or {}))


def handle_bad_bytes(_: Request[Any, Any, Any], exc: UnicodeDecodeError) -> Response[Any]:
    """msgspec decodes a request body that is not UTF-8 by raising this (not a DecodeError)."""
    return error_response(400, "invalid_request", f"body: not valid UTF-8 ({exc.reason} at byte {exc.start})")


def handle_recursion(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """msgspec refuses JSON nested deeper than Python recurses; any other RecursionError is ours."""
    if "deserializing" in str(exc):
        return error_response(400, "invalid_request", "body: JSON nested too deeply")
    return handle_unexpected(request, exc)


def handle_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled_error", error_type=type(exc).__name__)
    return error_response(500, "internal_error", f"{type(exc).__name__}: the server failed this request")


EXCEPTION_HANDLERS: dict[Any, Any] = {
    SrunError: handle_srun_error,
    HTTPException: handle_http_error,
    UnicodeDecodeError: handle_bad_bytes,
    RecursionError: handle_recursion,
    Exception: handle_unexpected,
}

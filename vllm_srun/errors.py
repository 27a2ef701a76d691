"""The runtime's error tree.

Every error a client can see is a `SrunError` subclass with a stable `code` and an HTTP
`status`. The app maps them to responses in one exception handler; everything below the app
raises these and never thinks about HTTP beyond the class attribute.
"""

from __future__ import annotations

import re

# A message that starts with a request field: `input[3]: …`, `options.head: …`.
_LEADING_FIELD = re.compile(r"([a-z_][\w]*(?:\[\d+\]|\.[a-z_]\w*)*): ")


class SrunError(Exception):
    """Base of every error the runtime reports to a caller.

    `param` names the request field at fault where there is one ("input", "input[3]",
    "options.head"): OpenAI's error field of that name, which its clients expose. Messages name
    that field first (`options.head: no head 'x'`), so without a `param` the leading field of
    the message is taken as it.
    """

    code = "internal_error"
    status = 500

    def __init__(
        self, message: str, *, headers: dict[str, str] | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        if param is None and (named := _LEADING_FIELD.match(message)):
            param = named.group(1)
        self.param = param


class InvalidRequest(SrunError):
    code = "invalid_request"
    status = 400


class ModelNotFound(SrunError):
    code = "model_not_found"
    status = 404


class JobNotFound(SrunError):
    code = "job_not_found"
    status = 404


class FileNotFound(SrunError):
    code = "file_not_found"
    status = 404


class BatchNotFound(SrunError):
    code = "batch_not_found"
    status = 404


class RequestTooLarge(SrunError):
    code = "request_too_large"
    status = 413


class UnsupportedSurface(SrunError):
    code = "unsupported_surface"
    status = 422


class Overloaded(SrunError):
    code = "overloaded"
    status = 429


class IdempotencyKeyReused(SrunError):
    """An Idempotency-Key sent again with another request (the IETF draft's 422)."""

    code = "idempotency_key_reused"
    status = 422


class NotReady(SrunError):
    code = "not_ready"
    status = 503


class Unavailable(SrunError):
    code = "unavailable"
    status = 503


class Unauthorized(SrunError):
    code = "unauthorized"
    status = 401


# Errors below are start-up errors: they stop a process from starting, with a message that
# names what to fix. They never reach a client.


class ConfigError(SrunError):
    """A setting, a model package or a plugin combination that cannot start."""

    code = "config_error"


class PluginConflict(ConfigError):
    code = "plugin_conflict"


class PackageError(ConfigError):
    """A model package that is malformed or unsafe to load."""

    code = "package_error"


def rust_panic(exc: BaseException) -> bool:
    """A panic in a Rust extension such as `tokenizers`: pyo3 raises it as `PanicException`, a
    BaseException that `except Exception` misses (its class is importable only once one fired)."""
    return type(exc).__name__ == "PanicException"


def model_failure(exc: BaseException) -> bool:
    """Whether `exc` is a failure of a model's own code, to be contained as that model's (or that
    input's) error: any Exception, and Rust panics. Interrupts and exits are not."""
    return isinstance(exc, Exception) or rust_panic(exc)

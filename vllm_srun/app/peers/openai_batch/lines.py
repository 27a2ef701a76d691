"""A batch input file's lines read, and a job's result lines written as OpenAI's output lines.

An input line is `{"custom_id", "method": "POST", "url", "body"}`; a file whose lines are not
that, or name two endpoints, fails whole with line-numbered errors (`Malformed`). An output line
is `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` with the
stored body inside verbatim, so it is byte for byte the interactive answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

# The endpoints a batch may name, and the surface each runs on.
ENDPOINTS = {"/v1/embeddings": "embeddings", "/v1/rerank": "rerank", "/v1/classify": "classify"}
MAX_CUSTOM_ID = 256
# At most this many errors are listed for a malformed file (OpenAI lists the first ones).
MAX_ERRORS = 100


class LineError(msgspec.Struct):
    """One entry of a batch's `errors.data` (OpenAI's BatchError)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


@dataclass
class Parsed:
    """A well-formed file: its endpoint, and each line's number, custom_id and body."""

    endpoint: str = ""
    entries: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)


def parse(content: bytes, *, endpoint: str, max_lines: int) -> Parsed:
    """The lines of `content` for a batch on `endpoint`; `errors` lists what makes it malformed."""
    out = Parsed(endpoint=endpoint)
    seen: set[str] = set()
    number = 0
    for raw in content.removeprefix(b"\xef\xbb\xbf").splitlines():
        number += 1
        if not raw.strip():
            continue
        if len(out.entries) >= max_lines:
            out.errors.append(
                LineError(
                    "too_many_requests", f"more than {max_lines} requests (--max-job-requests)", line=number
                )
            )
            break
        error = _entry(out, raw, number, seen)
        if error is not None:
            out.errors.append(error)
            if len(out.errors) >= MAX_ERRORS:
                break
    if not out.entries and not out.errors:
        out.errors.append(LineError("empty_file", "the input file has no request lines"))
    return out


def _entry(out: Parsed, raw: bytes, number: int, seen: set[str]) -> LineError | None:
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        return LineError("invalid_json_line", f"line {number}: not JSON: {exc}", line=number)
    if not isinstance(value, dict):
        return LineError("invalid_request", f"line {number}: must be a JSON object", line=number)
    extra = sorted(set(value) - {"custom_id", "method", "url", "body"})
    if extra:
        return LineError(
            "invalid_request", f"line {number}: unknown field {extra[0]!r}", param=extra[0], line=number
        )
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        message = f"custom_id: a non-empty string of at most {MAX_CUSTOM_ID} characters"
        return LineError("invalid_request", f"line {number}: {message}", param="custom_id", line=number)
    if custom_id in seen:
        return LineError(
            "duplicate_custom_id",
            f"line {number}: custom_id {custom_id!r} is used twice",
            param="custom_id",
            line=number,
        )
    if value.get("method") != "POST":
        return LineError(
            "invalid_method", f"line {number}: method: must be 'POST'", param="method", line=number
        )
    if value.get("url") != out.endpoint:
        message = (
            f"url: {value.get('url')!r} is not the batch's endpoint {out.endpoint!r} (one endpoint per batch)"
        )
        return LineError("mismatched_endpoint", f"line {number}: {message}", param="url", line=number)
    body = value.get("body")
    if not isinstance(body, dict):
        return LineError(
            "invalid_request", f"line {number}: body: must be a JSON object", param="body", line=number
        )
    seen.add(custom_id)
    out.entries.append((number, custom_id, body))
    return None


class Stored(msgspec.Struct):
    """A job's result line as stored (`records.result_line`), its body kept verbatim."""

    index: int
    custom_id: str | None = None
    response: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty: none
    error: dict[str, Any] | None = None


def line_id(batch_id: str, index: int, kind: str) -> str:
    """A line's `id` (`batch_req_…`) or `request_id`: the same on every read of the batch."""
    return hashlib.sha256(f"{batch_id}:{index}:{kind}".encode()).hexdigest()[:32]


def output_line(batch_id: str, custom_id: str, index: int, status: int, body: bytes) -> bytes:
    """`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`."""
    return (
        b'{"id":"batch_req_%s","custom_id":%s,"response":{"status_code":%d,"request_id":"%s","body":%s},"error":null}'
        % (
            line_id(batch_id, index, "line").encode(),
            msgspec.json.encode(custom_id),
            status,
            line_id(batch_id, index, "request").encode(),
            body,
        )
    )


def unanswered_line(batch_id: str, custom_id: str, index: int, code: str, message: str) -> bytes:
    """A line no request answered (the batch expired or was cancelled first): `response` null."""
    error = msgspec.json.encode({"code": code, "message": message})
    return b'{"id":"batch_req_%s","custom_id":%s,"response":null,"error":%s}' % (
        line_id(batch_id, index, "line").encode(),
        msgspec.json.encode(custom_id),
        error,
    )

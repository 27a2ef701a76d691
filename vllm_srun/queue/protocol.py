"""What travels through Redis between an app and a device worker.

Jobs and replies are msgpack (never pickle: nothing a Redis client writes is executed).
arq's own job envelope is msgpack too, through `serialize`/`deserialize`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vllm_srun import defaults
from vllm_srun.plugins.base import WorkItem


class JobPart(msgspec.Struct, array_like=True):
    """One request's share of a job that carries the misses of several: the job's items up to
    `end` (from the previous part's end), the id a withdrawal names, and its own deadline."""

    request_id: str
    end: int
    deadline_s: float | None = None


class JobPayload(msgspec.Struct, array_like=True):
    """The misses of the requests that arrived in one event-loop tick, for one deployment.

    `request_id` names the reply; `parts` splits the items by request (None: one request,
    `request_id` itself, with `deadline_s`)."""

    deployment: str
    model_sha256: str
    numerics: str
    items: list[WorkItem]
    reply_to: str
    request_id: str
    enqueued_s: float
    deadline_s: float | None = None
    ttl_s: int = defaults.CACHE_TTL_S
    priority: int = 0
    # The W3C trace context of the app's queue span (tracing.inject), so the worker's job span
    # joins the request's trace; None when the app does not trace. Last, with a default: a
    # payload from an app without it still decodes.
    trace: dict[str, str] | None = None
    parts: list[JobPart] | None = None

    def split(self) -> list[JobPart]:
        """The job's parts: one per request it carries."""
        return self.parts or [JobPart(self.request_id, len(self.items), self.deadline_s)]


class ChunkPayload(msgspec.Struct, array_like=True):
    """One chunk of a bulk job: the requests [start, end) and how many chunks the job has."""

    job_id: str
    deployment: str
    surface: str
    index: int
    start: int
    end: int
    chunks: int
    # The trace context of the request that made the bulk job (see JobPayload.trace).
    trace: dict[str, str] | None = None


class JobReply(msgspec.Struct, array_like=True):
    """Encoded results aligned with the job's items, and where the time went."""

    request_id: str
    results: list[bytes]
    queue_s: float
    forward_s: float


_encoder = msgspec.msgpack.Encoder()
_job_decoder = msgspec.msgpack.Decoder(JobPayload)
_reply_decoder = msgspec.msgpack.Decoder(JobReply)
_chunk_decoder = msgspec.msgpack.Decoder(ChunkPayload)


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def decode_job(raw: bytes) -> JobPayload:
    return _job_decoder.decode(raw)


def decode_reply(raw: bytes) -> JobReply:
    return _reply_decoder.decode(raw)


def decode_chunk(raw: bytes) -> ChunkPayload:
    return _chunk_decoder.decode(raw)


def serialize(value: dict[str, Any]) -> bytes:
    """arq's job envelope serializer."""
    return _encoder.encode(value)


def deserialize(raw: bytes) -> dict[str, Any]:
    value: dict[str, Any] = msgspec.msgpack.decode(raw)
    return value

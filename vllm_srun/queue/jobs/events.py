"""A bulk job's event stream, read on a client of its own (`streams`, a bounded blocking pool).

However many streams are open they cannot take the request path's connections; one read holds
at most `event_batch_bytes` of result lines, whatever a reader's pace. Event ids are the
stream's, one per result line, so a reader resumes after any one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from arq.connections import ArqRedis

from vllm_srun.errors import Unavailable
from vllm_srun.queue import keys, scripts
from vllm_srun.queue.jobs.records import TERMINAL, JobStatus, job_fields, status_of
from vllm_srun.queue.redis import BLOCKING_READ_S, REDIS_ERRORS

# Events one XREAD of a stream takes: each is small (an index, or a progress count).
_EVENTS_PER_READ = 200
# A job's stored result lines, in order, within a byte budget (lua/job_lines_within.lua).
_LINES_WITHIN = scripts.load("job_lines_within")


class EventReader:
    """Reads jobs' event streams on `streams` until each job's final status, or until `end()`."""

    def __init__(self, streams: ArqRedis, *, event_batch_bytes: int) -> None:
        self.streams = streams
        self.event_batch_bytes = event_batch_bytes
        self._lines_within = streams.register_script(_LINES_WITHIN)
        self._ended = asyncio.Event()

    def end(self) -> None:
        """End every stream at once, without a final status (see BulkStore.end_streams)."""
        self._ended.set()

    async def _status(self, job_id: str, owner: str | None) -> JobStatus:
        return status_of(job_id, await job_fields(self.streams, job_id), owner)

    async def read(
        self, job_id: str, last_id: str = "0-0", block_ms: int = int(BLOCKING_READ_S * 1000), *, owner: str | None = None
    ) -> AsyncIterator[tuple[str, str, bytes]]:
        """(event id, event name, data) from after `last_id`, until the job's final status; an
        empty event name is a keep-alive. Reads go through `streams`; between yields at most
        `event_batch_bytes` of result lines (or one line) are held."""
        await self._status(job_id, owner)
        key = keys.job_events_key(job_id)
        while True:
            try:
                batch = await self._read_events(key, last_id, block_ms)
            except REDIS_ERRORS as exc:
                raise Unavailable(f"Redis is unreachable: {exc}") from exc
            if self._ended.is_set():
                return
            read = [entry for _, entries in batch or [] for entry in entries]
            batch = None
            idle = not read
            events = _expand(read, last_id)
            del read
            while events:
                group, lines = await self._within_bytes(job_id, events)
                events = events[len(group) :]
                for event_id, fields in group:
                    last_id = event_id
                    event = fields[b"event"].decode()
                    data = fields.get(b"data")
                    yield last_id, event, bytes(data if data is not None else lines.pop(0) or b"null")
                    if event == "status":
                        return
                del group, lines  # a slow reader holds one group at most
            if idle:
                job = await self._status(job_id, None)
                if job.status not in TERMINAL:
                    # Nothing for `block_ms`: an empty event (sent as an SSE comment) keeps the
                    # connection alive and shows a client that left.
                    yield last_id, "", b""
                    continue
                # Resumed at or after the final event (or the job expired): still end with a
                # status event, so a client knows not to reconnect.
                yield last_id, "status", msgspec.json.encode({"status": job.status})
                return

    async def _within_bytes(self, job_id: str, entries: list[Any]) -> tuple[list[Any], list[bytes | None]]:
        """The first of `entries` whose result lines fit `event_batch_bytes` (at least one), and
        those lines in order, in one read: a result event carries its index, not a second copy
        of the line."""
        # At most one read's worth of indices: an entry of a chunk's lines expands to many.
        indices = [fields[b"index"] for _, fields in entries if b"index" in fields][:_EVENTS_PER_READ]
        if not indices:
            return entries, []
        try:
            lines = await self._lines_within(
                keys=[keys.job_results_key(job_id)],
                args=[self.event_batch_bytes, len(indices), *indices],
                client=self.streams,
            )
        except REDIS_ERRORS as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc
        seen, cut = 0, len(entries)
        for position, (_, fields) in enumerate(entries):
            if b"index" in fields:
                if seen == len(lines):
                    cut = position
                    break
                seen += 1
        return entries[:cut], list(lines)

    async def _read_events(self, key: str, last_id: str, block_ms: int) -> Any:
        """One XREAD of `key` after `last_id`, given up (None) when the streams are ended."""
        if self._ended.is_set():
            return None
        read = asyncio.ensure_future(
            self.streams.xread({key: last_id}, count=_EVENTS_PER_READ, block=block_ms)
        )
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait({read, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (read, ended):
                if not waiting.done():
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
        return read.result() if not read.cancelled() else None


def _event_id(text: str) -> tuple[int, int]:
    """A stream id (`ms-seq`, or `ms`: its first) as a pair that orders as Redis orders them."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _expand(entries: list[Any], after: str) -> list[tuple[str, dict[bytes, bytes]]]:
    """The events a reader sends for stream `entries` read after id `after`, each with its id: a
    `results` entry (the lines one chunk stored) is one `result` event per line, line k of n
    with id ms-(seq-n+1+k) (the chunk script leaves those ids free below the entry's own), and
    those at or before `after` were sent before a resumed read. Any other entry is one event."""
    out: list[tuple[str, dict[bytes, bytes]]] = []
    since = _event_id(after)
    for entry_id, fields in entries:
        raw = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        if fields.get(b"event") != b"results":
            out.append((raw, fields))
            continue
        ms, seq = _event_id(raw)
        indices = fields[b"indices"].split(b",")
        first = seq - len(indices) + 1
        for k, index in enumerate(indices):
            if (ms, first + k) > since:
                out.append((f"{ms}-{first + k}", {b"event": b"result", b"index": index}))
    return out

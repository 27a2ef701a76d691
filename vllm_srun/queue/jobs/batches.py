"""`BatchStore`: OpenAI Batch API files and batches in Redis, per caller, with the job TTL.

A file is its metadata and (uploaded) its bytes; a batch is its request and the id of the one
bulk job that runs it. Another caller's file or batch reads as one that does not exist. Ids
are checked against their pattern before a key is built from them.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from arq.connections import ArqRedis

from vllm_srun import defaults
from vllm_srun.errors import BatchNotFound, FileNotFound
from vllm_srun.queue import keys
from vllm_srun.queue.jobs.records import redis_unavailable

FILE_ID = re.compile(r"file-[0-9a-f]{32}")
BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")
# Records outlive the job's TTL by as long as a job's do, so a reader sees "expired", not 404.
_TOMBSTONE_S = 3600


def _decoded(fields: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in fields.items()}


class BatchStore:
    """Files and batches of every caller; `owner` is a caller id ("" without API keys)."""

    def __init__(self, redis: ArqRedis, *, ttl_s: int = defaults.JOB_TTL_S) -> None:
        self.redis = redis
        self.ttl_s = ttl_s

    @property
    def keep_s(self) -> int:
        return self.ttl_s + _TOMBSTONE_S

    @redis_unavailable
    async def put_file(
        self,
        *,
        owner: str,
        filename: str,
        purpose: str,
        content: bytes | None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, str]:
        """A new file of `content` (None: a batch's output, read from its job); its fields."""
        file_id = "file-" + uuid.uuid4().hex
        now = time.time()
        fields = {
            "id": file_id,
            "owner": owner,
            "filename": filename,
            "purpose": purpose,
            "bytes": str(len(content) if content is not None else int((extra or {}).get("bytes", 0))),
            "created_at": str(int(now)),
            "expires_at": str(int(now + self.ttl_s)),
            **{k: str(v) for k, v in (extra or {}).items()},
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.file_key(file_id), mapping=fields)
            pipe.expire(keys.file_key(file_id), self.keep_s)
            if content is not None:
                pipe.set(keys.file_content_key(file_id), content, ex=self.keep_s)
            pipe.zadd(keys.files_index_key(owner), {file_id: now})
            pipe.expire(keys.files_index_key(owner), self.keep_s)
            await pipe.execute()
        return fields

    @redis_unavailable
    async def file(self, file_id: str, *, owner: str) -> dict[str, str]:
        """The file's fields; FileNotFound for none, or another caller's."""
        fields = {}
        if FILE_ID.fullmatch(file_id):
            fields = _decoded(await self.redis.hgetall(keys.file_key(file_id)))  # type: ignore[misc]
        if not fields or fields.get("owner", "") != owner or float(fields["expires_at"]) < time.time():
            raise FileNotFound(f"file {file_id[:64]!r} does not exist (or has expired)", param="file_id")
        return fields

    @redis_unavailable
    async def content(self, file_id: str) -> bytes:
        data: bytes | None = await self.redis.get(keys.file_content_key(file_id))
        return data or b""

    @redis_unavailable
    async def delete_file(self, file_id: str, *, owner: str) -> None:
        await self.file(file_id, owner=owner)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.file_key(file_id), keys.file_content_key(file_id))
            pipe.zrem(keys.files_index_key(owner), file_id)
            await pipe.execute()

    @redis_unavailable
    async def listed(self, kind: str, *, owner: str, after: str | None, limit: int) -> tuple[list[str], bool]:
        """Ids of the caller's files or batches (`kind`), newest first, after the id `after`;
        True when there are more."""
        index = keys.files_index_key(owner) if kind == "file" else keys.batches_index_key(owner)
        ids = [i.decode() for i in await self.redis.zrevrange(index, 0, -1)]
        if after is not None and after in ids:
            ids = ids[ids.index(after) + 1 :]
        return ids[:limit], len(ids) > limit

    @redis_unavailable
    async def put_batch(self, fields: dict[str, Any], *, owner: str) -> dict[str, str]:
        """A new batch of `fields` (its request and its job's id, or its validation errors)."""
        batch_id = "batch_" + uuid.uuid4().hex
        now = time.time()
        record = {"id": batch_id, "owner": owner, "created_at": str(int(now)), **fields}
        record.setdefault("expires_at", str(int(now + self.ttl_s)))
        record = {k: str(v) for k, v in record.items()}
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.batch_key(batch_id), mapping=record)
            pipe.expire(keys.batch_key(batch_id), self.keep_s)
            pipe.zadd(keys.batches_index_key(owner), {batch_id: now})
            pipe.expire(keys.batches_index_key(owner), self.keep_s)
            await pipe.execute()
        return record

    @redis_unavailable
    async def batch(self, batch_id: str, *, owner: str) -> dict[str, str]:
        """The batch's fields; BatchNotFound for none, or another caller's."""
        fields = {}
        if BATCH_ID.fullmatch(batch_id):
            fields = _decoded(await self.redis.hgetall(keys.batch_key(batch_id)))  # type: ignore[misc]
        if not fields or fields.get("owner", "") != owner:
            raise BatchNotFound(f"batch {batch_id[:64]!r} does not exist (or has expired)", param="batch_id")
        return fields

    @redis_unavailable
    async def note(self, batch_id: str, fields: dict[str, Any]) -> bool:
        """Record `fields` on the batch where each is not yet set; True if the first is new
        (two replicas finalizing one batch record it once)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for name, value in fields.items():
                pipe.hsetnx(keys.batch_key(batch_id), name, str(value))
            done = await pipe.execute()
        return bool(done[0]) if done else False

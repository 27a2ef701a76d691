"""The app's side of the queue: cache lookup, enqueue of misses, and waiting by push.

A request costs two Redis round trips before the forward: one MGET on the result cache, and
one transaction that writes the arq job, adds it to the deployment's queue and wakes its
workers. Results this process saw recently are answered from its own copy (`LocalResults`)
without the MGET. The reply arrives on this process's own pub/sub channel; a slow poll of the result
cache is kept only as the fallback for a lost message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from vllm_srun.errors import NotReady, Unavailable
from vllm_srun.plugins.base import ItemError, Result, WorkItem
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.enqueue import add_job, remove_job
from vllm_srun.queue.redis import REDIS_ERRORS, describe_url, make_pool, pubsub_client
from vllm_srun.queue.results import LocalResults, decode_result

log = structlog.get_logger("vllm_srun.queue")

FALLBACK_POLL_S = 1.0
WORKER_CHECK_TTL_S = 1.0


@dataclass
class Submission:
    """Results aligned with the submitted items, and what the request cost."""

    results: list[Result]
    hits: int
    misses: int
    queue_s: float = 0.0
    forward_s: float = 0.0


class QueueClient:
    """One per app process: owns its Redis pool and its reply subscription."""

    def __init__(
        self, redis_url: str, *, result_ttl_s: int = 3600, local_cache_bytes: int = 64 << 20
    ) -> None:
        self.redis_url = redis_url
        self.result_ttl_s = result_ttl_s
        self.local = LocalResults(local_cache_bytes, result_ttl_s) if local_cache_bytes > 0 else None
        self.app_id = uuid.uuid4().hex
        self.redis = make_pool(redis_url)
        self._subscriber = pubsub_client(redis_url)
        self._reply_channel = keys.reply_channel(self.app_id)
        self._waiting: dict[str, asyncio.Future[protocol.JobReply]] = {}
        self._inflight: dict[tuple[str, str], asyncio.Future[Result]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._workers_seen: dict[str, float] = {}

    async def start(self) -> None:
        try:
            await self.redis.ping()
        except REDIS_ERRORS as exc:
            raise Unavailable(f"cannot reach Redis at {describe_url(self.redis_url)}: {exc}") from exc
        self._listener = asyncio.get_running_loop().create_task(self._listen(), name="reply-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), 5.0)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        with contextlib.suppress(*REDIS_ERRORS):
            await self._subscriber.aclose()
            await self.redis.aclose()

    async def _listen(self) -> None:
        while True:
            pubsub = self._subscriber.pubsub()
            try:
                await pubsub.subscribe(self._reply_channel)
                self._subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._on_reply(message["data"])
            except REDIS_ERRORS as exc:
                self._subscribed.clear()
                log.warning("reply_channel_lost", error=str(exc))
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _on_reply(self, raw: bytes) -> None:
        try:
            reply = protocol.decode_reply(raw)
        except Exception:
            log.warning("bad_reply")
            return
        future = self._waiting.pop(reply.request_id, None)
        if future is not None and not future.done():
            future.set_result(reply)

    async def live_workers(self, deployment: str) -> int:
        now_ms = int(time.time() * 1000)
        try:
            count: int = await self.redis.zcount(keys.worker_key(deployment), now_ms, "+inf")
        except REDIS_ERRORS as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc
        return count

    async def _require_worker(self, deployment: str) -> None:
        seen = self._workers_seen.get(deployment, 0.0)
        if time.monotonic() - seen < WORKER_CHECK_TTL_S:
            return
        if await self.live_workers(deployment) == 0:
            raise NotReady(f"no device worker serves {deployment!r} yet")
        self._workers_seen[deployment] = time.monotonic()

    async def submit(
        self,
        deployment: str,
        model_sha256: str,
        items: Sequence[WorkItem],
        *,
        numerics: str = "float32",
        timeout_s: float,
        deadline_s: float | None = None,
    ) -> Submission:
        """Results for `items` (each with its cache key): from the cache, in flight, or a forward."""
        if not items:
            return Submission([], 0, 0)
        found = await self._cached(deployment, items)
        results: list[Result | None] = [decode_result(raw) if raw else None for raw in found]
        hits = sum(r is not None for r in results)
        waits: dict[int, asyncio.Future[Result]] = {}
        misses: dict[str, WorkItem] = {}
        for index, (item, result) in enumerate(zip(items, results, strict=True)):
            if result is not None:
                continue
            key = (deployment, item.cache_key)
            if key not in self._inflight:
                self._inflight[key] = asyncio.get_running_loop().create_future()
                misses[item.cache_key] = item
            waits[index] = self._inflight[key]
        submission = Submission([], hits, len(items) - hits)
        if misses:
            try:
                await self._require_worker(deployment)
                await self._run(
                    deployment,
                    (model_sha256, numerics),
                    list(misses.values()),
                    submission,
                    timeout_s,
                    deadline_s,
                )
            finally:
                for cache_key in misses:
                    future = self._inflight.pop((deployment, cache_key), None)
                    if future is not None and not future.done():
                        future.set_result(ItemError("deadline_exceeded", "no result before the deadline"))
        for index, future in waits.items():
            results[index] = await _shielded(future, timeout_s)
        submission.results = [r if r is not None else _lost() for r in results]
        return submission

    async def _cached(self, deployment: str, items: Sequence[WorkItem]) -> list[bytes | None]:
        """Each item's encoded result from this process's copies, else one MGET; None: a miss."""
        local = self.local
        found: list[bytes | None] = [
            local.get(deployment, item.cache_key) if local is not None else None for item in items
        ]
        missing = [index for index, raw in enumerate(found) if raw is None]
        if not missing:
            return found
        try:
            cached = await self.redis.mget([keys.result_key(deployment, items[i].cache_key) for i in missing])
        except REDIS_ERRORS as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc
        for index, raw in zip(missing, cached, strict=True):
            if raw:
                found[index] = raw
                if local is not None:
                    local.put(deployment, items[index].cache_key, raw)
        return found

    async def _run(
        self,
        deployment: str,
        identity: tuple[str, str],
        items: list[WorkItem],
        submission: Submission,
        timeout_s: float,
        deadline_s: float | None,
    ) -> None:
        request_id = uuid.uuid4().hex
        reply_future: asyncio.Future[protocol.JobReply] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = reply_future
        payload = protocol.JobPayload(
            deployment=deployment,
            model_sha256=identity[0],
            numerics=identity[1],
            items=items,
            reply_to=self._reply_channel,
            request_id=request_id,
            enqueued_s=time.time(),
            deadline_s=deadline_s,
            ttl_s=self.result_ttl_s,
        )
        try:
            await self._enqueue(deployment, request_id, protocol.encode(payload), timeout_s)
            reply = await self._await_reply(deployment, items, reply_future, timeout_s)
        except asyncio.CancelledError:
            await asyncio.shield(self._withdraw(deployment, request_id))
            raise
        finally:
            self._waiting.pop(request_id, None)
        if reply is None:
            return
        submission.queue_s, submission.forward_s = reply.queue_s, reply.forward_s
        for item, raw in zip(items, reply.results, strict=True):
            if self.local is not None:
                self.local.put(deployment, item.cache_key, raw)
            future = self._inflight.get((deployment, item.cache_key))
            if future is not None and not future.done():
                future.set_result(decode_result(raw))

    async def _enqueue(self, deployment: str, job_id: str, payload: bytes, timeout_s: float) -> None:
        """The arq job, its queue entry and the wake-up, in one transaction."""
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                add_job(
                    pipe,
                    queue=keys.queue_name(deployment),
                    function=keys.RUN_ITEMS,
                    payload=payload,
                    expires_s=timeout_s + 60,
                    job_id=job_id,
                )
                pipe.publish(keys.wake_channel(deployment), b"1")
                await pipe.execute()
        except REDIS_ERRORS as exc:
            raise Unavailable(f"Redis is unreachable: {exc}") from exc

    async def _withdraw(self, deployment: str, request_id: str) -> None:
        """Take a request's job out of the queue, and tell a worker that took it to drop it."""
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                remove_job(pipe, queue=keys.queue_name(deployment), job_id=request_id)
                pipe.publish(keys.cancel_channel(deployment), request_id.encode())
                await pipe.execute()
        except REDIS_ERRORS as exc:
            log.warning("withdraw_failed", error=str(exc))

    async def _await_reply(
        self,
        deployment: str,
        items: list[WorkItem],
        reply_future: asyncio.Future[protocol.JobReply],
        timeout_s: float,
    ) -> protocol.JobReply | None:
        """The pushed reply; if none comes, what the result cache holds by the timeout."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while True:
            remaining = give_up - loop.time()
            if remaining <= 0:
                return None
            try:
                return await asyncio.wait_for(asyncio.shield(reply_future), min(FALLBACK_POLL_S, remaining))
            except TimeoutError:
                pass
            if await self._fallback(deployment, items):
                return None

    async def _fallback(self, deployment: str, items: list[WorkItem]) -> bool:
        """Resolve what the cache already holds; True when nothing is left to wait for."""
        pending = [i for i in items if not self._inflight[(deployment, i.cache_key)].done()]
        try:
            cached = await self.redis.mget([keys.result_key(deployment, i.cache_key) for i in pending])
        except REDIS_ERRORS:
            return False
        for item, raw in zip(pending, cached, strict=True):
            if raw:
                self._inflight[(deployment, item.cache_key)].set_result(decode_result(raw))
        return all(self._inflight[(deployment, i.cache_key)].done() for i in items)


async def _shielded(future: asyncio.Future[Result], timeout_s: float) -> Result:
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        return ItemError("deadline_exceeded", "no result before the deadline")


def _lost() -> ItemError:
    return ItemError("forward_failed", "the result was lost")

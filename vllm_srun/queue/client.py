"""The app's side of the queue: results through the gateway, misses enqueued, waiting by push.

A request costs two Redis round trips before the forward: the gateway's MGET on the result
cache (none when this process's own copy holds every result), and one transaction that writes
the arq job, adds it to the deployment's queue and wakes its workers. The reply arrives on this
process's own pub/sub channel; a slow poll of the result cache is kept only as the fallback for
a lost message. A job whose worker died runs again on another worker once its lease lapses
(queue/leases.py); the job names this channel, so the retry's reply reaches the request, which
waits for it within its own timeout. The first reply for a request wins; a second one (a job
that ran twice) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

import structlog

from vllm_srun import defaults, tracing
from vllm_srun.errors import NotReady, Unavailable
from vllm_srun.plugins.base import WorkItem
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.arq_compat import add_job, remove_job
from vllm_srun.queue.gateway import Ran, ResultGateway, Submission
from vllm_srun.queue.redis import REDIS_ERRORS, describe_url, make_pool, pubsub_client
from vllm_srun.queue.results import LocalResults

# Submission is the gateway's; the app reads it as what `QueueClient.submit` returns.
__all__ = ["QueueClient", "Submission"]

log = structlog.get_logger("vllm_srun.queue")

FALLBACK_POLL_S = 1.0
# The reply subscription, once lost, is tried again after this, doubling up to the maximum.
RESUBSCRIBE_S = 0.1
RESUBSCRIBE_MAX_S = 2.0
WORKER_CHECK_TTL_S = 1.0


class QueueClient:
    """One per app process: owns its Redis pool and its reply subscription."""

    # Set by `refuse`: why requests are answered 503 now (None: they are served).
    _refusal: str | None = None

    def __init__(
        self,
        redis_url: str,
        *,
        result_ttl_s: int = defaults.CACHE_TTL_S,
        local_cache_bytes: int = defaults.LOCAL_CACHE_MB << 20,
        cache_url: str | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.result_ttl_s = result_ttl_s
        self.app_id = uuid.uuid4().hex
        self.redis = make_pool(redis_url)
        # Result-cache entries only (--cache-redis); queues and job state stay on `redis`.
        self.cache = make_pool(cache_url) if cache_url else self.redis
        local = LocalResults(local_cache_bytes, result_ttl_s) if local_cache_bytes > 0 else None
        self.gateway = ResultGateway(self.cache, ttl_s=result_ttl_s, local=local)
        self._subscriber = pubsub_client(redis_url)
        self._reply_channel = keys.reply_channel(self.app_id)
        self._waiting: dict[str, asyncio.Future[protocol.JobReply]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._workers_seen: dict[str, float] = {}
        self._closing = False

    async def start(self) -> None:
        try:
            await self.redis.ping()
        except REDIS_ERRORS as exc:
            raise Unavailable(f"cannot reach Redis at {describe_url(self.redis_url)}: {exc}") from exc
        self._listener = asyncio.get_running_loop().create_task(self._listen(), name="reply-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._subscribed.wait(), 5.0)

    async def close(self) -> None:
        self._closing = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        with contextlib.suppress(*REDIS_ERRORS):
            await self._subscriber.aclose()
            await self.redis.aclose()
            if self.cache is not self.redis:
                await self.cache.aclose()

    def refuse(self, reason: str) -> None:
        """Answer every request still waiting for a reply, and every later one, with 503
        `unavailable` (this process is stopping): a client hears why rather than losing its
        connection. Their jobs leave the queue; a worker that already runs one still stores it."""
        self._refusal = reason
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(Unavailable(reason))

    async def _listen(self) -> None:
        # The loops check `_closing` as well as being cancelled: redis-py can swallow a
        # cancellation that lands while it reads, and the listener would never end.
        # Lost (Redis restarted, a failover): subscribe again, sooner than a fixed poll would
        # and without hammering a Redis that is still down; one warning per outage.
        delay_s = RESUBSCRIBE_S
        while not self._closing:
            pubsub = self._subscriber.pubsub()
            try:
                await pubsub.subscribe(self._reply_channel)
                self._subscribed.set()
                if delay_s > RESUBSCRIBE_S:
                    log.info("reply_channel_back")
                delay_s = RESUBSCRIBE_S
                while not self._closing:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self._on_reply(message["data"])
            except Exception as exc:  # an ended listener leaves requests to the fallback
                self._subscribed.clear()
                if delay_s == RESUBSCRIBE_S:
                    log.warning("reply_channel_lost", error=repr(exc))
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RESUBSCRIBE_MAX_S)
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

    async def engines(self, deployment: str) -> dict[str, Any]:
        """What the live workers' engines say of `deployment` (see `keys.engines_key`): the
        paths any of them runs, in first-seen order, and the most memory each path added on any
        of them; `{}` when no live worker said anything or Redis cannot be read (what is
        reported here informs; it never fails the request that asks)."""
        now_ms = int(time.time() * 1000)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrangebyscore(keys.worker_key(deployment), now_ms, "+inf")
                pipe.hgetall(keys.engines_key(deployment))
                live, described = await pipe.execute()
        except REDIS_ERRORS:
            return {}
        paths: list[str] = []
        memory: dict[str, int] = {}
        for worker in live:
            raw = described.get(worker)
            try:
                said = json.loads(raw) if raw is not None else {}
            except ValueError:
                continue
            paths += [p for p in said.get("engine_paths", ()) if p not in paths]
            for path, size in dict(said.get("memory_bytes") or {}).items():
                memory[path] = max(memory.get(path, 0), int(size))
        return {"engine_paths": paths, "memory_bytes": memory} if paths else {}

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
        """Results for `items` (each with its cache key), through the result gateway; its misses
        go to a device worker as one job."""
        # The cache span covers the gateway's lookup, up to the job for the misses (its sibling).
        lookup = tracing.start("cache", deployment=deployment, items=len(items))

        async def run(misses: list[WorkItem]) -> Ran:
            lookup.end(misses=len(misses))
            with tracing.span("queue", kind="producer", deployment=deployment, items=len(misses)):
                await self._require_worker(deployment)
                return await self._run(deployment, (model_sha256, numerics), misses, timeout_s, deadline_s)

        try:
            return await self.gateway.resolve(deployment, items, run, timeout_s=timeout_s)
        finally:
            lookup.end(misses=0)

    async def _run(
        self,
        deployment: str,
        identity: tuple[str, str],
        items: list[WorkItem],
        timeout_s: float,
        deadline_s: float | None,
    ) -> Ran:
        """One job for `items`; the worker stores their results before it replies."""
        if self._refusal is not None:
            raise Unavailable(self._refusal)
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
            trace=tracing.inject(),
        )
        try:
            await self._enqueue(deployment, request_id, protocol.encode(payload), timeout_s)
            ran = await self._await_reply(deployment, items, reply_future, timeout_s)
            if any(raw is None for raw in ran.results):
                # Timed out: nobody waits for the rest any more, so it leaves the queue.
                await asyncio.shield(self._withdraw(deployment, request_id))
            return ran
        except asyncio.CancelledError:
            await asyncio.shield(self._withdraw(deployment, request_id))
            raise
        except Unavailable:
            if self._refusal is not None:
                await asyncio.shield(self._withdraw(deployment, request_id))
            raise
        finally:
            self._waiting.pop(request_id, None)

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
    ) -> Ran:
        """The pushed reply; if none comes, what the result cache holds by the timeout."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        found: list[bytes | None] = [None] * len(items)
        while True:
            remaining = give_up - loop.time()
            if remaining <= 0:
                return Ran(found, stored=True)
            try:
                reply = await asyncio.wait_for(asyncio.shield(reply_future), min(FALLBACK_POLL_S, remaining))
            except TimeoutError:
                pass
            else:
                return Ran(list(reply.results), stored=True, queue_s=reply.queue_s, forward_s=reply.forward_s)
            if await self._fallback(deployment, items, found):
                return Ran(found, stored=True)

    async def _fallback(self, deployment: str, items: list[WorkItem], found: list[bytes | None]) -> bool:
        """Fill `found` from what the result cache already holds; True when nothing is missing."""
        pending = [index for index, raw in enumerate(found) if raw is None]
        try:
            stored = await self.cache.mget([keys.result_key(deployment, items[i].cache_key) for i in pending])
        except REDIS_ERRORS:
            return False
        for index, raw in zip(pending, stored, strict=True):
            if raw:
                found[index] = raw
        return all(raw is not None for raw in found)

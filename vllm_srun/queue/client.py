"""The app's side of the queue: results through the gateway, misses enqueued, waiting by push.

`QueueClient.submit` is a request's one way in. The misses of one event-loop tick go to a
device worker as one arq job (with the shared cache on the main Redis, one script looks the
misses up and queues the job); the reply comes on this process's own pub/sub channel, with a
slow poll of the result cache as the fallback. A job whose worker died runs again elsewhere
once its lease lapses, and its reply still reaches the request; the first reply wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from vllm_srun import defaults, tracing
from vllm_srun.errors import NotReady, Unavailable
from vllm_srun.plugins.base import WorkItem
from vllm_srun.queue import keys, protocol
from vllm_srun.queue.arq_compat import GET_OR_ADD_MAX_KEYS, get_or_add_job, remove_job
from vllm_srun.queue.gateway import Ran, ResultGateway, Submission
from vllm_srun.queue.planning import KeyIdentity
from vllm_srun.queue.redis import (
    REDIS_ERRORS,
    describe_url,
    is_cluster,
    lost_connection,
    make_pool,
    mget,
    out_of_memory,
    pipeline,
    publish,
    state_full,
    unavailable_when_lost,
)
from vllm_srun.queue.replies import Replies
from vllm_srun.queue.results import LocalResults
from vllm_srun.queue.workers import Workers

# Submission is the gateway's; the app reads it as what `QueueClient.submit` returns.
__all__ = ["QueueClient", "Submission"]

log = structlog.get_logger("vllm_srun.queue")

FALLBACK_POLL_S = 1.0


# A request that timed out waits this long at most for its job to leave the queue.
WITHDRAW_WAIT_S = 0.25

# A job outlives the longest timeout of its requests by this (arq's job expiry).
JOB_EXPIRY_S = 60


@dataclass(frozen=True)
class _Ask:
    """What one request's misses belong to: the model's identity (digest, numerics), its
    timeout and deadline, whether the job's script looks the shared cache up, its cache span."""

    identity: tuple[str, str]
    timeout_s: float
    deadline_s: float | None
    looks_up: bool
    lookup: Any


@dataclass(eq=False)
class _Part:
    """One request's misses on their way into the job of their event-loop tick."""

    request_id: str
    items: list[WorkItem]
    deadline_s: float | None
    timeout_s: float
    trace: dict[str, str] | None
    # Set once the job is queued (or everything was found): `found` holds the results found in
    # the shared cache, `job_id` the job running the rest ("" when none) and `positions` each
    # item's index among the job's items (-1: found).
    sent: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    found: list[bytes | None] = field(default_factory=list)
    job_id: str = ""
    reply: asyncio.Future[protocol.JobReply] | None = None
    positions: list[int] = field(default_factory=list)
    # How long the job's body lives in Redis (its record of withdrawn parts lives as long).
    expires_s: float = 0.0
    # When the request stops waiting (the event loop's clock): set as it enters `_run`.
    give_up: float = 0.0

    def __post_init__(self) -> None:
        self.found = [None] * len(self.items)
        self.positions = [-1] * len(self.items)


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
        # One Redis for both: the shared cache is looked up by the script that queues the job
        # (not on a cluster: the cache entries are in other slots than the queue).
        self._looks_up = self.cache is self.redis and not is_cluster(self.redis)
        self._replies = Replies(redis_url, self.app_id)
        self._waiting = self._replies.waiting
        self._closing = False
        # The misses that arrived in this tick, per deployment and model identity: one job.
        self._ticks: dict[tuple[str, str, str, bool], list[_Part]] = {}
        self._sending: set[asyncio.Task[Any]] = set()
        # Per job in flight: the request ids of the parts still waiting for its reply.
        self._jobs: dict[str, set[str]] = {}
        # What this replica knows of the device workers: live ones, their engines.
        self.workers = Workers(self.redis)

    async def start(self) -> None:
        try:
            await self.redis.ping()
        except REDIS_ERRORS as exc:
            raise Unavailable(f"cannot reach Redis at {describe_url(self.redis_url)}: {exc}") from exc
        await self._replies.start()

    async def close(self) -> None:
        self._closing = True
        self.workers.close()
        for task in list(self._sending):
            task.cancel()
        await self._replies.close()
        with contextlib.suppress(*REDIS_ERRORS):
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

    @property
    def link_down(self) -> str | None:
        """Why this process's link to the main Redis is down now (its reply subscription lost,
        or silent past `RedisTimeouts.silence_s`); None while it is up."""
        return self._replies.link_down

    async def submit(
        self,
        deployment: str,
        model_sha256: str,
        items: Sequence[WorkItem],
        *,
        numerics: str = "float32",
        timeout_s: float,
        deadline_s: float | None = None,
        cache_salt: str = "",
    ) -> Submission:
        """Results for `items`, through the result gateway, which gives them their cache keys
        (model, numerics, the caller's `cache_salt`); the misses go to a device worker in the
        job of this event-loop tick."""
        # The cache span covers the gateway's lookup, up to the job for the misses (its sibling).
        lookup = tracing.start("cache", deployment=deployment, items=len(items))
        looks_up = self._looks_up
        ask = _Ask((model_sha256, numerics), timeout_s, deadline_s, looks_up, lookup)
        try:
            return await self.gateway.resolve(
                deployment,
                items,
                self,
                ask,
                identity=KeyIdentity(model_sha256, numerics, cache_salt),
                timeout_s=timeout_s,
                runner_looks_up=looks_up,
            )
        finally:
            lookup.end(misses=0)

    async def run_misses(self, deployment: str, misses: list[WorkItem], ask: _Ask) -> Ran:
        """The gateway's misses of one request, in the job of this tick (`gateway.MissRunner`)."""
        ask.lookup.end(misses=len(misses))
        with tracing.span("queue", kind="producer", deployment=deployment, items=len(misses)):
            if self.link_down is not None and self._refusal is None:
                # Known down: refused at once, not after a timeout per request.
                raise Unavailable(self.link_down, headers={"Retry-After": "1"})
            try:
                has_worker = await asyncio.wait_for(self.workers.has_worker(deployment), ask.timeout_s)
            except TimeoutError:
                raise self._unanswered(ask.timeout_s) from None
            if self._refusal is None and has_worker and self._refusal is None:
                part = _Part(
                    keys.arq_job_id(deployment), misses, ask.deadline_s, ask.timeout_s, tracing.inject()
                )
                return await self._run(deployment, ask.identity, part, ask.looks_up)
            # Nothing can run (no worker, or this process stops): stored results are still
            # answered, and only a request that needs a forward is refused.
            if ask.looks_up:
                found = await self.gateway.cached(deployment, misses)
                if all(raw is not None for raw in found):
                    return Ran(found, stored=True, cached=[True] * len(found))
            if self._refusal is not None:
                raise Unavailable(self._refusal)
            raise NotReady(f"no device worker serves {deployment!r} yet")

    async def _run(self, deployment: str, identity: tuple[str, str], part: _Part, looks_up: bool) -> Ran:
        """`part`'s items in the job of this tick; the worker stores their results before it
        replies. A request that ends without them (cancelled, timed out, refused) withdraws."""
        tick_key = (deployment, *identity, looks_up)
        tick = self._ticks.get(tick_key)
        if tick is None:
            tick = self._ticks[tick_key] = []
            asyncio.get_running_loop().call_soon(self._flush, tick_key)
        tick.append(part)
        part.give_up = asyncio.get_running_loop().time() + part.timeout_s
        try:
            try:
                await asyncio.wait_for(asyncio.shield(part.sent), part.timeout_s)
            except TimeoutError:
                # Redis took the request's whole time to queue it (a link that lags or went
                # silent): 503 now; its job leaves the queue once it is there (below).
                raise self._unanswered(part.timeout_s) from None
            if not part.job_id:  # every item was found in the shared cache
                return Ran(list(part.found), stored=True, cached=[True] * len(part.found))
            ran = await self._await_reply(deployment, part)
            if any(raw is None for raw in ran.results):
                # Timed out: nobody waits for the rest any more, so it leaves the queue; the
                # answer waits for that a moment at most (a lagging link would delay it).
                withdrawing = self._in_background(self._withdraw(deployment, part))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(withdrawing), WITHDRAW_WAIT_S)
            return ran
        except asyncio.CancelledError:
            await asyncio.shield(self._withdraw(deployment, part))
            raise
        except Unavailable:
            if self._refusal is not None:
                await asyncio.shield(self._withdraw(deployment, part))
            else:
                # In the background (after `_leave`, which it agrees with): a lagging link
                # does not delay the answer.
                self._in_background(self._withdraw(deployment, part))
            raise
        finally:
            self._leave(part)

    def _unanswered(self, timeout_s: float) -> Unavailable:
        why = self.link_down or f"Redis at {describe_url(self.redis_url)} did not answer"
        return Unavailable(
            f"{why}: no answer within the request's {timeout_s:g} s", headers={"Retry-After": "1"}
        )

    def _in_background(self, work: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        return task

    def _flush(self, tick_key: tuple[str, str, str, bool]) -> None:
        """Send the misses that arrived in this tick as one job."""
        parts = self._ticks.pop(tick_key, [])
        if parts:
            deployment, sha256, numerics, looks_up = tick_key
            self._in_background(self._send(deployment, (sha256, numerics), parts, looks_up))

    async def _send(
        self, deployment: str, identity: tuple[str, str], parts: list[_Part], looks_up: bool
    ) -> None:
        """Queue one job for `parts` (looking their items up first where `looks_up`: only what
        is not stored runs), and tell each part where its items went."""
        try:
            if looks_up:
                items = [item for part in parts for item in part.items]
                result_keys = [keys.result_key(deployment, item.cache_key) for item in items]
                if len(result_keys) <= GET_OR_ADD_MAX_KEYS:
                    job_id, payload, timeout_s = self._job(deployment, identity, parts)
                    found = await self._get_or_add(deployment, job_id, payload, timeout_s, result_keys)
                else:
                    found = await mget(self.cache, result_keys)
                if all(raw is None for raw in found) and len(result_keys) <= GET_OR_ADD_MAX_KEYS:
                    self._sent(job_id, parts, timeout_s + JOB_EXPIRY_S)
                    return
                position = 0
                for part in parts:  # what was found is answered; the rest runs
                    part.found = list(found[position : position + len(part.items)])
                    position += len(part.items)
            pending = [part for part in parts if any(raw is None for raw in part.found)]
            # The parts found whole are answered first: a failure to queue the rest is not theirs.
            self._sent("", [part for part in parts if part not in pending])
            if not pending:
                return
            job_id, payload, timeout_s = self._job(deployment, identity, pending)
            await self._enqueue(deployment, job_id, payload, timeout_s)
            self._sent(job_id, pending, timeout_s + JOB_EXPIRY_S)
        except asyncio.CancelledError:
            for part in parts:
                part.sent.cancel()
            raise
        except Exception as exc:  # each request hears it; the task itself ends quietly
            error: BaseException = exc
            if lost_connection(exc):
                error = Unavailable(f"Redis is unreachable: {exc}", headers={"Retry-After": "1"})
            elif out_of_memory(exc):
                error = state_full()
            for part in parts:
                if not part.sent.done():
                    part.sent.set_exception(error)

    def _job(
        self, deployment: str, identity: tuple[str, str], parts: list[_Part]
    ) -> tuple[str, bytes, float]:
        """A job for the items `parts` still need: its id, payload and the longest timeout."""
        job_items: list[WorkItem] = []
        job_parts: list[protocol.JobPart] = []
        for part in parts:
            job_items += [item for item, raw in zip(part.items, part.found, strict=True) if raw is None]
            job_parts.append(protocol.JobPart(part.request_id, len(job_items), part.deadline_s))
        deadlines = [part.deadline_s for part in parts]
        # A job of one request is that request's, as the worker's cancel messages name it.
        job_id = parts[0].request_id if len(parts) == 1 else keys.arq_job_id(deployment)
        payload = protocol.JobPayload(
            deployment=deployment,
            model_sha256=identity[0],
            numerics=identity[1],
            items=job_items,
            reply_to=self._replies.channel,
            request_id=job_id,
            enqueued_s=time.time(),
            deadline_s=None if None in deadlines else max(d for d in deadlines if d is not None),
            ttl_s=self.result_ttl_s,
            trace=next((part.trace for part in parts if part.trace), None),
            parts=job_parts if len(parts) > 1 else None,
        )
        return job_id, protocol.encode(payload), max(part.timeout_s for part in parts)

    def _sent(self, job_id: str, parts: list[_Part], expires_s: float = 0.0) -> None:
        """`parts` are in job `job_id` ("": nothing left to run), whose body lives `expires_s`:
        each hears where."""
        reply = None
        if job_id:
            reply = self._waiting[job_id] = asyncio.get_running_loop().create_future()
            self._jobs[job_id] = {part.request_id for part in parts}
        position = 0
        for part in parts:
            part.job_id, part.reply, part.expires_s = job_id, reply, expires_s
            for index, raw in enumerate(part.found):
                if raw is None:
                    part.positions[index] = position
                    position += 1
            if not part.sent.done():
                part.sent.set_result(None)

    def _leave(self, part: _Part) -> None:
        """`part` no longer waits: the job's reply is dropped once no part waits for it."""
        members = self._jobs.get(part.job_id)
        if members is None:
            return
        members.discard(part.request_id)
        if not members:
            self._jobs.pop(part.job_id, None)
            self._waiting.pop(part.job_id, None)

    async def _enqueue(self, deployment: str, job_id: str, payload: bytes, timeout_s: float) -> None:
        """The arq job, its queue entry and the wake-up, in one script (one slot on a cluster)."""
        with unavailable_when_lost():
            await self._get_or_add(deployment, job_id, payload, timeout_s, [])

    async def _get_or_add(
        self, deployment: str, job_id: str, payload: bytes, timeout_s: float, result_keys: list[str]
    ) -> list[bytes | None]:
        """`get_or_add_job` on `deployment`'s queue: the stored results of `result_keys`, and the
        job queued with its wake-up where none is stored."""
        return await get_or_add_job(
            self.redis,
            queue=keys.queue_name(deployment),
            function=keys.RUN_ITEMS,
            payload=payload,
            expires_s=timeout_s + JOB_EXPIRY_S,
            job_id=job_id,
            result_keys=result_keys,
            wake_channel=keys.wake_channel(deployment),
        )

    async def _withdraw(self, deployment: str, part: _Part) -> None:
        """Tell a worker that took `part`'s job to drop its items; once no part of the job
        waits, take the job out of the queue. A job that others still wait for stays queued:
        the part is recorded with it (`keys.withdrawn_key`, as long as the job's body lives),
        so a worker that claims it later, and so never heard the cancel message, skips it."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await part.sent  # a part still on its way is withdrawn once it is queued
        if not part.job_id:
            return
        members = self._jobs.get(part.job_id, set())
        members.discard(part.request_id)  # before any await: parts withdrawn together see it
        last = not members
        try:
            async with pipeline(self.redis, transaction=True) as pipe:
                if last:
                    remove_job(pipe, queue=keys.queue_name(deployment), job_id=part.job_id)
                else:
                    withdrawn = keys.withdrawn_key(part.job_id)
                    pipe.sadd(withdrawn, part.request_id)
                    pipe.pexpire(withdrawn, max(1, int(part.expires_s * 1000)))
                publish(
                    pipe,
                    keys.cancel_channel(deployment),
                    part.request_id.encode(),
                    after=keys.queue_name(deployment),
                )
                await pipe.execute()
        except Exception as exc:
            if not lost_connection(exc):
                raise
            log.warning("withdraw_failed", error=str(exc))

    async def _await_reply(self, deployment: str, part: _Part) -> Ran:
        """The pushed reply; if none comes, what the result cache holds by the timeout. At the
        timeout with results missing and the link to Redis down (or its last read failed),
        Unavailable: the request is answered 503 at its deadline, not with items that merely
        ran late."""
        loop = asyncio.get_running_loop()
        give_up = part.give_up or loop.time() + part.timeout_s
        found = list(part.found)
        cached = [raw is not None for raw in found]
        reply_future = part.reply
        reachable = True
        while True:
            remaining = give_up - loop.time()
            if remaining <= 0 or reply_future is None:
                if (self.link_down or not reachable) and any(raw is None for raw in found):
                    raise self._unanswered(part.timeout_s)
                return Ran(found, stored=True, cached=cached)
            try:
                reply = await asyncio.wait_for(asyncio.shield(reply_future), min(FALLBACK_POLL_S, remaining))
            except TimeoutError:
                pass
            else:
                for index, position in enumerate(part.positions):
                    if position >= 0:
                        found[index] = reply.results[position]
                return Ran(
                    found, stored=True, queue_s=reply.queue_s, forward_s=reply.forward_s, cached=cached
                )
            remaining = give_up - loop.time()
            try:
                filled = await asyncio.wait_for(self._fallback(deployment, part.items, found), remaining)
            except TimeoutError:
                # Cut by the deadline: a read that took a poll's interval or more tells of a
                # link that lags or went silent; a shorter one, of nothing.
                filled = None if remaining >= FALLBACK_POLL_S else False
            reachable = filled is not None
            if filled:
                return Ran(found, stored=True, cached=cached)

    async def _fallback(
        self, deployment: str, items: list[WorkItem], found: list[bytes | None]
    ) -> bool | None:
        """Fill `found` from what the result cache already holds; True when nothing is missing,
        None when the cache could not be read."""
        pending = [index for index, raw in enumerate(found) if raw is None]
        try:
            stored = await mget(
                self.cache, [keys.result_key(deployment, items[i].cache_key) for i in pending]
            )
        except Exception as exc:
            if not lost_connection(exc):
                raise
            return None
        for index, raw in zip(pending, stored, strict=True):
            if raw:
                found[index] = raw
        return all(raw is not None for raw in found)

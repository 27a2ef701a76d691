"""The result gateway: how every work item gets its result, interactive or bulk.

`ResultGateway.resolve` gives items their cache keys, then looks in order at this process's
copy, the shared cache (one MGET), identical items in flight here, and hands the misses to
its caller's `MissRunner.run_misses`; results are written back to both caches. Results are
`results.encode_result` bytes; item errors are never cached. The cache connection holds
result-cache entries only (it may evict): queues and job state are never touched here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from arq.connections import ArqRedis
from redis.asyncio.client import Pipeline

from vllm_srun.plugins.base import ItemError, Result, WorkItem
from vllm_srun.queue import keys
from vllm_srun.queue.planning import KeyIdentity, assign_keys
from vllm_srun.queue.redis import mget, unavailable_when_lost
from vllm_srun.queue.results import LocalResults, cacheable, decode_result


@dataclass
class Submission:
    """Results aligned with the submitted items, and what the request cost."""

    results: list[Result]
    hits: int
    misses: int
    queue_s: float = 0.0
    forward_s: float = 0.0
    # Per item: True when its result came from a cache (this process's copy or the shared one).
    cached: list[bool] = field(default_factory=list)


@dataclass
class Ran:
    """What a runner made of the misses: encoded results aligned with them (None: no result
    came back), whether it already stored them in the shared cache, and where the time went.
    A runner that looks up the shared cache itself (`resolve(..., runner_looks_up=True)`) says
    which results it found there (`cached`, aligned with the misses; None: none)."""

    results: list[bytes | None]
    stored: bool = False
    queue_s: float = 0.0
    forward_s: float = 0.0
    cached: list[bool] | None = None


# Above this many items, cache keys are hashed off the event loop.
KEYS_INLINE_ITEMS = 32

Job = TypeVar("Job", contravariant=True)


class MissRunner(Protocol[Job]):
    """How a gateway's owner runs misses: the app's queue client enqueues them for a device
    worker, a worker's chunk runner hands them to its coalescer. `job` is the caller's plain
    record of what the misses belong to (passed through `resolve` untouched)."""

    async def run_misses(self, deployment: str, misses: list[WorkItem], job: Job) -> Ran:
        """Run `misses` (distinct cache keys): their encoded results, aligned with them."""
        ...


def write_back(
    pipe: Pipeline, deployment: str, items: Sequence[WorkItem], encoded: Sequence[bytes], ttl_s: int
) -> None:
    """Queue on `pipe` the shared-cache writes for `items`' results: errors and items without a
    cache key are not stored. Writing the same key twice writes the same bytes (idempotent)."""
    for item, raw in zip(items, encoded, strict=True):
        if item.cache_key and cacheable(raw):
            pipe.set(keys.result_key(deployment, item.cache_key), raw, ex=ttl_s)


class ResultGateway:
    """One per process side (the app's queue client, a worker's chunk runner).

    `cache` is the result-cache connection: the cache Redis, or the main one when they are the
    same server.
    """

    def __init__(self, cache: ArqRedis, *, ttl_s: int, local: LocalResults | None = None) -> None:
        self.cache = cache
        self.ttl_s = ttl_s
        self.local = local
        self._inflight: dict[tuple[str, str], asyncio.Future[Result]] = {}

    async def resolve(
        self,
        deployment: str,
        items: Sequence[WorkItem],
        runner: MissRunner[Job],
        job: Job,
        *,
        identity: KeyIdentity | None = None,
        timeout_s: float | None = None,
        runner_looks_up: bool = False,
    ) -> Submission:
        """Results for `items`: cached, in flight, or run by `runner.run_misses(..., job)`.

        With `identity`, each item is given its cache key here (`planning.assign_keys`);
        without, the items carry theirs. With `runner_looks_up`, the shared cache is not read
        here: the runner gets every item that
        this process neither holds nor has in flight, and looks each up itself (the app's
        get-or-enqueue script does both in one round trip), saying which it found (`Ran.cached`).
        An item waited for longer than `timeout_s` (None: no limit) is `deadline_exceeded`.
        An item another caller was running, whose run ended without its result (that caller
        was cancelled, timed out or failed), is resolved again by this caller in its own time,
        never given that caller's outcome.
        """
        if not items:
            return Submission([], 0, 0)
        if identity is not None:
            if len(items) > KEYS_INLINE_ITEMS:
                await asyncio.to_thread(assign_keys, items, identity)
            else:
                assign_keys(items, identity)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        found = self._local(deployment, items) if runner_looks_up else await self.cached(deployment, items)
        results: list[Result | None] = [decode_result(raw) if raw else None for raw in found]
        cached = [r is not None for r in results]
        hits = sum(cached)
        waits: dict[int, asyncio.Future[Result]] = {}
        misses: dict[str, WorkItem] = {}
        for index, (item, result) in enumerate(zip(items, results, strict=True)):
            if result is not None:
                continue
            key = (deployment, item.cache_key)
            if key not in self._inflight:
                self._inflight[key] = loop.create_future()
                misses[item.cache_key] = item
            waits[index] = self._inflight[key]
        submission = Submission([], hits, len(items) - hits, cached=cached)
        found_keys: set[str] = set()
        if misses:
            try:
                found_keys = await self._run(deployment, list(misses.values()), runner, job, submission)
            finally:
                for cache_key in misses:
                    future = self._inflight.pop((deployment, cache_key), None)
                    if future is not None and not future.done():
                        future.set_result(_GAVE_UP)
        again: list[int] = []
        for index, future in waits.items():
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            result = await _shielded(future, remaining)
            if result is _GAVE_UP and items[index].cache_key not in misses:
                again.append(index)  # another caller's run ended without it: ours to run now
            else:
                results[index] = _DEADLINE if result is _GAVE_UP else result
        if again:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            retried = await self.resolve(
                deployment, [items[i] for i in again], runner, job, timeout_s=remaining
            )
            for index, result in zip(again, retried.results, strict=True):
                results[index] = result
        if found_keys:  # found in the shared cache by the runner: hits, not misses
            for index, item in enumerate(items):
                if item.cache_key in found_keys and item.cache_key in misses:
                    cached[index] = True
            submission.hits = sum(cached)
            submission.misses = len(items) - submission.hits
        submission.results = [r if r is not None else _lost() for r in results]
        return submission

    def _local(self, deployment: str, items: Sequence[WorkItem]) -> list[bytes | None]:
        local = self.local
        if local is None:
            return [None] * len(items)
        return [local.get(deployment, item.cache_key) for item in items]

    async def cached(self, deployment: str, items: Sequence[WorkItem]) -> list[bytes | None]:
        """Each item's encoded result from this process's copy, else one MGET; None: a miss."""
        local = self.local
        found: list[bytes | None] = [
            local.get(deployment, item.cache_key) if local is not None else None for item in items
        ]
        missing = [index for index, raw in enumerate(found) if raw is None]
        if not missing:
            return found
        with unavailable_when_lost():
            stored = await mget(
                self.cache, [keys.result_key(deployment, items[i].cache_key) for i in missing]
            )
        for index, raw in zip(missing, stored, strict=True):
            if raw:
                found[index] = raw
                if local is not None:
                    local.put(deployment, items[index].cache_key, raw)
        return found

    async def _run(
        self,
        deployment: str,
        misses: list[WorkItem],
        runner: MissRunner[Job],
        job: Job,
        submission: Submission,
    ) -> set[str]:
        """Run the misses; returns the cache keys the runner found in the shared cache."""
        ran = await runner.run_misses(deployment, misses, job)
        submission.queue_s, submission.forward_s = ran.queue_s, ran.forward_s
        if not ran.stored:
            done = [(item, raw) for item, raw in zip(misses, ran.results, strict=True) if raw is not None]
            with unavailable_when_lost():
                async with self.cache.pipeline(transaction=False) as pipe:
                    write_back(pipe, deployment, [i for i, _ in done], [r for _, r in done], self.ttl_s)
                    await pipe.execute()
        for item, raw in zip(misses, ran.results, strict=True):
            if raw is None:
                continue
            if self.local is not None:
                self.local.put(deployment, item.cache_key, raw)
            future = self._inflight.get((deployment, item.cache_key))
            if future is not None and not future.done():
                future.set_result(decode_result(raw))
        if not ran.cached:
            return set()
        return {item.cache_key for item, hit in zip(misses, ran.cached, strict=True) if hit}


# What an in-flight item's future holds when the run that owned it ended without its result.
_GAVE_UP = ItemError("deadline_exceeded", "the run that owned this item ended without it")
_DEADLINE = ItemError("deadline_exceeded", "no result before the deadline")


async def _shielded(future: asyncio.Future[Result], timeout_s: float | None) -> Result:
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        return _DEADLINE


def _lost() -> ItemError:
    return ItemError("unavailable", "the result was lost")

"""What an app replica knows of the device workers: which are live, what their engines say.

Read from the workers' heartbeats (`keys.worker_key`) and engine reports (`keys.engines_key`)
in the main Redis. A live worker is trusted for WORKER_CHECK_TTL_S; a request's meta reads the
engines' report at most ENGINES_TTL_S old, without waiting on Redis once it was read.
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial
from typing import Any

from arq.connections import ArqRedis

from vllm_srun.queue import keys
from vllm_srun.queue.redis import lost_connection, unavailable_when_lost

WORKER_CHECK_TTL_S = 1.0
# A request's meta reports the engines' description read at most this long ago (see `recent_engines`).
ENGINES_TTL_S = 1.0


class Workers:
    """One per queue client, on its main Redis."""

    def __init__(self, redis: ArqRedis) -> None:
        self.redis = redis
        self._workers_seen: dict[str, float] = {}
        self._worker_checks: dict[str, asyncio.Future[int]] = {}
        # Per deployment: when `engines` last answered, and what (for `recent_engines`).
        self._engines_read: dict[str, tuple[float, dict[str, Any]]] = {}
        self._engines_reading: dict[str, asyncio.Task[dict[str, Any]]] = {}

    def close(self) -> None:
        for task in list(self._engines_reading.values()):
            task.cancel()

    async def live(self, deployment: str) -> int:
        """How many workers serving `deployment` beat in time; Unavailable if Redis is away."""
        now_ms = int(time.time() * 1000)
        with unavailable_when_lost():
            count: int = await self.redis.zcount(keys.worker_key(deployment), now_ms, "+inf")
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
        except Exception as exc:
            if not lost_connection(exc):
                raise
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

    async def recent_engines(self, deployment: str) -> dict[str, Any]:
        """What `engines` said of `deployment` at most ENGINES_TTL_S ago, for a request's meta.
        An older answer is returned as it is while one read refreshes it in the background: a
        request whose results are all stored then waits on no Redis round trip (under load, a
        round trip waits behind every other request's turn of the event loop). Only the first
        request of a deployment waits for the read."""
        read = self._engines_read.get(deployment)
        if read is not None and time.monotonic() - read[0] < ENGINES_TTL_S:
            return read[1]
        task = self._engines_reading.get(deployment)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read_engines(deployment))
            self._engines_reading[deployment] = task
            task.add_done_callback(lambda _: self._engines_reading.pop(deployment, None))
        if read is not None:
            return read[1]
        return await asyncio.shield(task)

    async def _read_engines(self, deployment: str) -> dict[str, Any]:
        said = await self.engines(deployment)
        self._engines_read[deployment] = (time.monotonic(), said)
        return said

    async def has_worker(self, deployment: str) -> bool:
        """Whether a live worker serves `deployment` (a yes is trusted for WORKER_CHECK_TTL_S)."""
        seen = self._workers_seen.get(deployment, 0.0)
        if time.monotonic() - seen < WORKER_CHECK_TTL_S:
            return True
        # Requests that find the answer stale wait for one check together, so they go on in the
        # same tick (and share its job) rather than each after a round trip of its own.
        check = self._worker_checks.get(deployment)
        if check is None:
            check = asyncio.ensure_future(self.live(deployment))
            self._worker_checks[deployment] = check
            check.add_done_callback(partial(self._checked, deployment))
        if await asyncio.shield(check) == 0:
            return False
        self._workers_seen[deployment] = time.monotonic()
        return True

    def _checked(self, deployment: str, check: asyncio.Future[int]) -> None:
        """A worker check ended: the next stale request starts another. Its failure is marked
        seen here; the requests waiting on it hear it, and if all of them left, nobody would
        (asyncio would log "Task exception was never retrieved")."""
        self._worker_checks.pop(deployment, None)
        if not check.cancelled():
            check.exception()

"""Coalescing work items of concurrent jobs into batches: the one place batching rules live.

A batch holds at most `max_num_seqs` rows and `max_num_batched_tokens` tokens (a larger item
runs alone); an idle device waits up to `batch_wait_ms` only for a burst, never for a lone
caller or a `batch_invariant` model. Interactive items go before bulk, small requests before
large ones (which still get a full batch at least every other forward); identical cache keys
pending run once; an item past its deadline is answered `deadline_exceeded` and never runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from vllm_srun import defaults, tracing
from vllm_srun.plugins.base import ItemError, LoadedModel, Result, WorkItem
from vllm_srun.plugins.stats import Stats

log = structlog.get_logger("vllm_srun.queue")

INTERACTIVE = 0
BULK = 1


@dataclass(frozen=True, kw_only=True)
class BatchLimits:
    """One deployment's batch bounds: rows and tokens per forward, and the idle wait for more."""

    max_num_seqs: int = defaults.MAX_NUM_SEQS
    max_num_batched_tokens: int = defaults.MAX_NUM_BATCHED_TOKENS
    batch_wait_ms: float = defaults.BATCH_WAIT_MS
    small_request_items: int = defaults.SMALL_REQUEST_ITEMS


@dataclass(frozen=True)
class Outcome:
    """One item's result and the timing of the batch it ran in (zero if it never ran)."""

    result: Result
    queue_s: float = 0.0
    forward_s: float = 0.0


@dataclass
class _Slot:
    """One distinct item waiting to run, and everyone waiting for its result."""

    item: WorkItem
    priority: int
    enqueued_s: float
    deadline_s: float | None
    # Items of the smallest request waiting here (the batch order favours small requests).
    request_items: int
    waiters: list[asyncio.Future[Outcome]] = field(default_factory=list)
    # The trace context of each submit that waits here (tracing.current); None when off, so an
    # untraced item costs no list.
    traces: list[Any] | None = None


class Coalescer:
    """Batches one deployment's items; forwards run on the device's single-thread executor."""

    def __init__(
        self,
        model: LoadedModel,
        *,
        limits: BatchLimits,
        executor: Executor,
        stats: Stats,
    ) -> None:
        self.model = model
        self.limits = limits
        self.executor = executor
        self.stats = stats
        self._pending: dict[str, _Slot] = {}
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_arrival_s = float("-inf")
        self._burst = False
        # The last batch was cut short for small requests: the next one goes in arrival order.
        self._after_small_batch = False

    @property
    def name(self) -> str:
        return self.model.info.name

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"coalescer:{self.name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for slot in self._pending.values():
            for waiter in slot.waiters:
                if not waiter.done():
                    waiter.cancel()
        self._pending.clear()

    def submit(
        self,
        items: Sequence[WorkItem],
        *,
        priority: int = INTERACTIVE,
        enqueued_s: float | None = None,
        deadline_s: float | None = None,
    ) -> list[asyncio.Future[Outcome]]:
        """Queue items; each future resolves to that item's Outcome (array or ItemError)."""
        loop = asyncio.get_running_loop()
        now = time.time() if enqueued_s is None else enqueued_s
        arrival = time.monotonic()
        self._burst = arrival - self._last_arrival_s < self.limits.batch_wait_ms / 1000.0
        self._last_arrival_s = arrival
        futures: list[asyncio.Future[Outcome]] = []
        trace = tracing.current()
        for item in items:
            key = item.cache_key or f"anon:{id(item)}"
            slot = self._pending.get(key)
            if slot is None:
                slot = _Slot(item, priority, now, deadline_s, len(items))
                self._pending[key] = slot
            else:
                # A second waiter for work already queued: keep the most urgent terms.
                slot.priority = min(slot.priority, priority)
                slot.request_items = min(slot.request_items, len(items))
                if deadline_s is None or slot.deadline_s is None:
                    slot.deadline_s = None
                else:
                    slot.deadline_s = max(slot.deadline_s, deadline_s)
            future: asyncio.Future[Outcome] = loop.create_future()
            slot.waiters.append(future)
            if trace is not None:
                slot.traces = [*(slot.traces or ()), trace]
            futures.append(future)
        self._event.set()
        return futures

    def _full(self) -> bool:
        if len(self._pending) >= self.limits.max_num_seqs:
            return True
        tokens = sum(slot.item.tokens() for slot in self._pending.values())
        return tokens >= self.limits.max_num_batched_tokens

    def _take(self) -> list[_Slot]:
        """The next batch: interactive first, small requests first, then arrival order, within
        the limits; right after a small-only batch, interactive first, then arrival order."""
        now = time.time()
        batch: list[_Slot] = []
        tokens = 0
        small = self.limits.small_request_items
        # Small requests go first except right after a batch of their own: else a small request
        # arriving during every forward would keep a large one waiting as long as they come.
        favour_small = not self._after_small_batch
        self._after_small_batch = False

        def order(kv: tuple[str, _Slot]) -> tuple[int, bool, float]:
            slot = kv[1]
            return slot.priority, favour_small and slot.request_items > small, slot.enqueued_s

        ordered = sorted(self._pending.items(), key=order)
        # Behind a backlog (more than one batch pending), small interactive requests run in a
        # batch of their own: a full batch of a large request's items would cost them one more
        # full forward, where their own small one costs a few rows.
        backlog = favour_small and (
            len(self._pending) > self.limits.max_num_seqs
            or sum(s.item.tokens() for s in self._pending.values()) > self.limits.max_num_batched_tokens
        )
        for key, slot in ordered:
            if slot.deadline_s is not None and slot.deadline_s < now:
                del self._pending[key]
                _resolve(slot, ItemError("deadline_exceeded", "the item's deadline passed before it ran"))
                continue
            if all(w.cancelled() for w in slot.waiters):
                del self._pending[key]
                continue
            cost = slot.item.tokens()
            if batch and (
                len(batch) >= self.limits.max_num_seqs or tokens + cost > self.limits.max_num_batched_tokens
            ):
                break
            if backlog and batch and _small(batch[0], small) and _large(slot, small):
                self._after_small_batch = True
                break  # the small requests' batch ends here
            del self._pending[key]
            batch.append(slot)
            tokens += cost
        return batch

    async def _wait_for_batch(self) -> None:
        """Idle until an item arrives; then the batching window, unless waiting cannot help."""
        while not self._pending:
            self._event.clear()
            await self._event.wait()
        if self.model.batch_invariant or self.limits.batch_wait_ms <= 0 or not self._burst:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + self.limits.batch_wait_ms / 1000.0
        while not self._full():
            remaining = until - loop.time()
            if remaining <= 0:
                return
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except TimeoutError:
                return

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_batch()
            while self._pending:
                batch = self._take()
                if batch:
                    await self._forward(loop, batch)

    async def _forward(self, loop: asyncio.AbstractEventLoop, batch: list[_Slot]) -> None:
        # One batch serves many jobs: its span is a child of the first job's span and links to
        # every job it serves (the first included), so each job's trace finds the batch; a job's
        # items all carry its context, so each context links once.
        traces = list({id(t): t for slot in batch if slot.traces for t in slot.traces}.values())
        with tracing.span(
            "batch",
            parent=traces[0] if traces else None,
            links=traces,
            model=self.name,
            size=len(batch),
        ):
            await self._forward_batch(loop, batch)

    async def _forward_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Slot]) -> None:
        items = [slot.item for slot in batch]
        started = time.time()
        try:
            with tracing.span("forward", model=self.name, size=len(items)):
                arrays = await loop.run_in_executor(self.executor, self.model.run, items)
            if len(arrays) != len(items):
                raise RuntimeError(f"model returned {len(arrays)} results for {len(items)} items")
        except Exception as exc:
            if len(batch) > 1:
                # One bad item must not fail the requests it shares a batch with: run each half
                # again, so only the item that fails fails (2 log n forwards for one culprit).
                log.warning(
                    "forward_failed_splitting", model=self.name, batch_size=len(items), error=str(exc)
                )
                half = len(batch) // 2
                await self._forward(loop, batch[:half])
                await self._forward(loop, batch[half:])
                return
            log.exception("forward_failed", model=self.name, batch_size=len(items))
            error = ItemError("unavailable", f"the forward failed: {type(exc).__name__}: {exc}")
            for slot in batch:
                _resolve(slot, error)
            return
        forward_s = time.time() - started
        queue_s = max(0.0, started - min(slot.enqueued_s for slot in batch))
        self.stats.record_batch(
            model=self.name,
            size=len(items),
            tokens=sum(item.tokens() for item in items),
            forward_s=forward_s,
            queue_s=queue_s,
        )
        for slot, array in zip(batch, arrays, strict=True):
            _resolve(slot, np.asarray(array, dtype=np.float32), queue_s, forward_s)


def _small(slot: _Slot, small_request_items: int) -> bool:
    """Whether `slot` is an item of a small interactive request."""
    return slot.priority == INTERACTIVE and slot.request_items <= small_request_items


def _large(slot: _Slot, small_request_items: int) -> bool:
    """Whether `slot` is an item of a large interactive request."""
    return slot.priority == INTERACTIVE and slot.request_items > small_request_items


def _resolve(slot: _Slot, result: Result, queue_s: float = 0.0, forward_s: float = 0.0) -> None:
    outcome = Outcome(result, queue_s, forward_s)
    for waiter in slot.waiters:
        if not waiter.done():
            waiter.set_result(outcome)

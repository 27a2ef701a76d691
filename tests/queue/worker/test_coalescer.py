"""The coalescer's batching rules, on the example model's real counting engine."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from helpers import write_keywords

from vllm_srun.plugins.base import ItemError, LoadedModel, WorkItem
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.plugins.stats import StatLoggerBase, Stats
from vllm_srun.queue.worker.coalescer import BULK, INTERACTIVE, BatchLimits, Coalescer
from vllm_srun.registry.loader import ModelOptions, load_model


class Batches(StatLoggerBase):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        self.sizes.append(size)


@pytest.fixture
def model(tmp_path: Path) -> LoadedModel:
    package = write_keywords(tmp_path / "kw", "batching")
    loaded, _ = load_model(
        load_plugins(), ModelOptions(ref=str(package), engine="example_counts"), with_engine=True
    )
    return loaded


def items(n: int, length: int = 3, start: int = 0) -> list[WorkItem]:
    # Term ids stay inside the 6-term vocabulary; the cache key keeps items distinct.
    return [
        WorkItem(token_ids=[1] * length + [(start + i) % 5 + 1], cache_key=f"k{start + i}") for i in range(n)
    ]


async def run(
    model: LoadedModel, limits: BatchLimits, *groups: tuple[list[WorkItem], int]
) -> tuple[list, Batches]:
    batches = Batches()
    coalescer = Coalescer(model, limits=limits, executor=ThreadPoolExecutor(1), stats=Stats([batches]))
    futures = [f for group, priority in groups for f in coalescer.submit(group, priority=priority)]
    coalescer.start()
    outcomes = await asyncio.wait_for(asyncio.gather(*futures), 10)
    await coalescer.close()
    return outcomes, batches


async def test_batches_respect_max_num_seqs(model: LoadedModel) -> None:
    outcomes, batches = await run(
        model, BatchLimits(max_num_seqs=4, batch_wait_ms=0), (items(10), INTERACTIVE)
    )
    assert batches.sizes == [4, 4, 2]
    assert all(isinstance(o.result, np.ndarray) for o in outcomes)
    assert outcomes[3].result[4] == 1  # the histogram counts the row's last id


async def test_batches_respect_the_token_budget(model: LoadedModel) -> None:
    limits = BatchLimits(max_num_seqs=100, max_num_batched_tokens=10, batch_wait_ms=0)
    _, batches = await run(model, limits, (items(5, length=4), INTERACTIVE))
    assert batches.sizes == [2, 2, 1]


async def test_an_item_over_the_budget_runs_alone(model: LoadedModel) -> None:
    limits = BatchLimits(max_num_seqs=100, max_num_batched_tokens=4, batch_wait_ms=0)
    outcomes, batches = await run(model, limits, (items(2, length=9), INTERACTIVE))
    assert batches.sizes == [1, 1] and all(isinstance(o.result, np.ndarray) for o in outcomes)


async def test_identical_keys_run_once(model: LoadedModel) -> None:
    same = [WorkItem(token_ids=[1, 2], cache_key="same") for _ in range(3)]
    outcomes, batches = await run(model, BatchLimits(batch_wait_ms=0), (same, INTERACTIVE))
    assert batches.sizes == [1] and len(outcomes) == 3


async def test_interactive_goes_before_bulk(model: LoadedModel) -> None:
    limits = BatchLimits(max_num_seqs=2, batch_wait_ms=0)
    bulk, interactive = items(4, start=0), items(2, start=100)
    batches = Batches()
    coalescer = Coalescer(model, limits=limits, executor=ThreadPoolExecutor(1), stats=Stats([batches]))
    bulk_futures = coalescer.submit(bulk, priority=BULK)
    interactive_futures = coalescer.submit(interactive, priority=INTERACTIVE)
    order: list[str] = []
    for label, futures in (("bulk", bulk_futures), ("interactive", interactive_futures)):
        for f in futures:
            f.add_done_callback(lambda _f, label=label: order.append(label))
    coalescer.start()
    await asyncio.wait_for(asyncio.gather(*bulk_futures, *interactive_futures), 10)
    await coalescer.close()
    assert order[:2] == ["interactive", "interactive"]


async def test_the_window_gathers_concurrent_items(model: LoadedModel) -> None:
    batches = Batches()
    coalescer = Coalescer(
        model, limits=BatchLimits(batch_wait_ms=100), executor=ThreadPoolExecutor(1), stats=Stats([batches])
    )
    coalescer.start()
    first = coalescer.submit(items(1, start=0))
    await asyncio.sleep(0.02)
    second = coalescer.submit(items(1, start=1))
    await asyncio.sleep(0.02)
    third = coalescer.submit(items(1, start=2))
    await asyncio.wait_for(asyncio.gather(*first, *second, *third), 10)
    await coalescer.close()
    # The first arrival after a quiet spell runs at once; the burst behind it is gathered.
    assert batches.sizes == [1, 2]


async def test_a_lone_caller_waits_for_nobody(model: LoadedModel) -> None:
    batches = Batches()
    coalescer = Coalescer(
        model, limits=BatchLimits(batch_wait_ms=2000), executor=ThreadPoolExecutor(1), stats=Stats([batches])
    )
    coalescer.start()
    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*coalescer.submit(items(1))), 10)
    await coalescer.close()
    assert time.monotonic() - started < 1.0 and batches.sizes == [1]


async def test_expired_items_answer_deadline_exceeded(model: LoadedModel) -> None:
    batches = Batches()
    coalescer = Coalescer(model, limits=BatchLimits(), executor=ThreadPoolExecutor(1), stats=Stats([batches]))
    late = coalescer.submit(items(1), deadline_s=time.time() - 1)
    fine = coalescer.submit(items(1, start=5))
    coalescer.start()
    outcomes = await asyncio.wait_for(asyncio.gather(*late, *fine), 10)
    await coalescer.close()
    assert isinstance(outcomes[0].result, ItemError) and outcomes[0].result.code == "deadline_exceeded"
    assert isinstance(outcomes[1].result, np.ndarray) and batches.sizes == [1]


async def test_a_failing_item_fails_alone(model: LoadedModel) -> None:
    # A negative term id makes the example engine's bincount raise: that forward fails.
    bad = WorkItem(token_ids=[1, -1], cache_key="bad")
    good = items(7)
    outcomes, batches = await run(
        model, BatchLimits(max_num_seqs=8, batch_wait_ms=0), ([*good[:3], bad, *good[3:]], INTERACTIVE)
    )
    errors = [o.result for o in outcomes if isinstance(o.result, ItemError)]
    assert len(errors) == 1 and outcomes[3].result is errors[0]
    assert errors[0].code == "unavailable"
    alone, _ = await run(model, BatchLimits(max_num_seqs=8, batch_wait_ms=0), (good, INTERACTIVE))
    for outcome, expected in zip(outcomes[:3] + outcomes[4:], alone, strict=True):
        np.testing.assert_array_equal(outcome.result, expected.result)
    # Successful forwards: 0-7 fail; 0-3 fail, 4-7 run; 0-1 run, 2-3 fail; 2 runs, 3 fails alone.
    assert sorted(batches.sizes) == [1, 2, 4]


async def test_a_lone_request_behind_a_backlog_runs_in_the_next_forward_alone(model: LoadedModel) -> None:
    # Large requests queue several full batches; a lone item arrives while the first one runs.
    # It waits for that forward only, and runs in a batch of its own: the large requests' rest
    # follows in their order.
    import threading

    limits = BatchLimits(max_num_seqs=4, batch_wait_ms=0)
    forwards: list[list[str | None]] = []
    started, release = threading.Event(), threading.Event()
    real_run = model.run

    def run(batch: list[WorkItem]) -> list[np.ndarray]:
        forwards.append([item.cache_key for item in batch])
        if len(forwards) == 1:
            started.set()
            release.wait(10)
        return real_run(batch)

    model.run = run  # type: ignore[method-assign]
    coalescer = Coalescer(model, limits=limits, executor=ThreadPoolExecutor(1), stats=Stats([]))
    large = [f for start in (0, 12) for f in coalescer.submit(items(12, start=start))]
    coalescer.start()
    await asyncio.to_thread(started.wait, 10)
    (lone,) = coalescer.submit([WorkItem(token_ids=[1, 2, 3], cache_key="lone")])
    bulk = coalescer.submit(items(2, start=50), priority=BULK)
    release.set()
    await asyncio.wait_for(asyncio.gather(*large, lone, *bulk), 10)
    await coalescer.close()
    assert len(forwards[0]) == 4 and "lone" not in forwards[0]
    assert forwards[1] == ["lone"]
    rest = [key for batch in forwards[2:] for key in batch]
    assert rest == [*(f"k{i}" for i in range(4, 24)), "k50", "k51"]


async def test_without_a_backlog_small_and_large_requests_share_a_batch(model: LoadedModel) -> None:
    limits = BatchLimits(max_num_seqs=8, batch_wait_ms=0, small_request_items=1)
    _, batches = await run(
        model, limits, (items(3), INTERACTIVE), (items(1, start=10), INTERACTIVE), (items(2, start=20), BULK)
    )
    assert batches.sizes == [6]
    # Behind a backlog of large requests the small one goes alone; with bulk items only behind
    # it, they fill its batch as before.
    _, batches = await run(
        model, limits, (items(9), INTERACTIVE), (items(1, start=10), INTERACTIVE), (items(2, start=20), BULK)
    )
    assert batches.sizes == [1, 8, 3]
    _, batches = await run(model, limits, (items(1, start=10), INTERACTIVE), (items(9, start=20), BULK))
    assert batches.sizes == [8, 2]


async def test_steady_small_traffic_neither_starves_a_large_request_nor_waits_behind_it(
    model: LoadedModel,
) -> None:
    # A one-item request arrives during every forward while a large request (several batches)
    # waits. The large one must still get its batches, and each small one runs by the end of
    # the second forward after it arrives (the one in progress, then at most one full batch).
    limits = BatchLimits(max_num_seqs=8, batch_wait_ms=0, small_request_items=1)
    forwards: list[list[str | None]] = []
    real_run = model.run
    loop = asyncio.get_running_loop()
    coalescer = Coalescer(model, limits=limits, executor=ThreadPoolExecutor(1), stats=Stats([]))
    small: dict[str, tuple[int, asyncio.Future]] = {}
    large_done = asyncio.Event()

    def arrive(during: int) -> None:
        # On the loop while forward number `during` (1-based) runs.
        key = f"small{len(small)}"
        (future,) = coalescer.submit([WorkItem(token_ids=[2, 3, 4], cache_key=key)])
        small[key] = (during, future)

    def run(batch: list[WorkItem]) -> list[np.ndarray]:
        forwards.append([item.cache_key for item in batch])
        if not large_done.is_set() and len(forwards) < 200:
            loop.call_soon_threadsafe(arrive, len(forwards))
        time.sleep(0.005)
        return real_run(batch)

    model.run = run  # type: ignore[method-assign]
    large = coalescer.submit(items(40))
    gathered = asyncio.gather(*large)
    gathered.add_done_callback(lambda _f: large_done.set())
    coalescer.start()
    await asyncio.wait_for(gathered, 20)
    large_forwards = len(forwards)
    await asyncio.wait_for(asyncio.gather(*(f for _, f in small.values())), 10)
    await coalescer.close()
    # 40 items in batches of 8: five full batches, each at most one small-only batch apart.
    assert large_forwards <= 2 * 5, forwards[:large_forwards]
    assert small, "no small request arrived"
    ran_in = {key: number for number, batch in enumerate(forwards, 1) for key in batch}
    for key, (arrived_during, _) in small.items():
        assert ran_in[key] <= arrived_during + 2, (key, arrived_during, forwards)

"""The result gateway on a real Redis: local copy, shared cache, in flight, run, write back.

The runner here is the gateway's own seam (how misses run), written as the bulk path writes
it: it computes each item's result and returns the encoded bytes.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from arq.connections import ArqRedis

from vllm_srun.plugins.base import ItemError, WorkItem
from vllm_srun.queue import keys
from vllm_srun.queue.gateway import Ran, ResultGateway
from vllm_srun.queue.results import LocalResults, encode_result


def item(*ids: int) -> WorkItem:
    return WorkItem(token_ids=list(ids), cache_key="key-" + "-".join(map(str, ids)))


async def running(runner: Runner, calls: int, timeout_s: float = 10.0) -> None:
    """Until `runner` has been asked to run `calls` times (a caller looked the cache up, found
    nothing, and holds its items in flight)."""
    deadline = time.monotonic() + timeout_s
    while len(runner.calls) < calls:
        assert time.monotonic() < deadline, f"asked {runner.calls}, waited for {calls} runs"
        await asyncio.sleep(0.01)


class Runner:
    """Runs misses as a forward would: the sum of the ids; records what it was asked to run."""

    def __init__(self, *, stored: bool = False, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.stored = stored
        self.fail = fail
        self.release = asyncio.Event()
        self.release.set()

    async def run_misses(self, deployment: str, misses: list[WorkItem], job: None) -> Ran:
        self.calls.append([m.cache_key for m in misses])
        await self.release.wait()
        if self.fail:
            return Ran([encode_result(ItemError("forward_failed", "boom")) for _ in misses])
        arrays = [np.array([sum(m.token_ids)], dtype=np.float32) for m in misses]
        return Ran([encode_result(a) for a in arrays], stored=self.stored, queue_s=0.5, forward_s=0.25)


async def test_misses_run_once_and_are_written_back_as_float32(redis: ArqRedis) -> None:
    gateway = ResultGateway(redis, ttl_s=60)
    runner = Runner()
    got = await gateway.resolve("m", [item(1, 2), item(3), item(1, 2)], runner, None)
    assert runner.calls == [["key-1-2", "key-3"]]  # the duplicate ran once
    assert [float(r[0]) for r in got.results] == [3.0, 3.0, 3.0]
    assert (got.hits, got.misses, got.cached) == (0, 3, [False, False, False])
    assert (got.queue_s, got.forward_s) == (0.5, 0.25)
    raw = await redis.get(keys.result_key("m", "key-3"))
    assert raw == encode_result(np.array([3.0], dtype=np.float32))  # binary float32, not JSON
    assert 0 < await redis.ttl(keys.result_key("m", "key-3")) <= 60


async def test_hits_come_from_the_local_copy_then_the_shared_cache(redis: ArqRedis) -> None:
    local = LocalResults(1 << 20, 60)
    first = ResultGateway(redis, ttl_s=60, local=local)
    runner = Runner()
    await first.resolve("m", [item(4)], runner, None)
    assert local.get("m", "key-4") is not None

    # The local copy answers without Redis: the shared entry is gone and it still hits.
    await redis.delete(keys.result_key("m", "key-4"))
    again = await first.resolve("m", [item(4)], runner, None)
    assert again.cached == [True] and len(runner.calls) == 1

    # Another process's gateway (no local copy) finds what the first wrote back.
    await first.resolve("m", [item(5)], runner, None)
    other = ResultGateway(redis, ttl_s=60)
    shared = await other.resolve("m", [item(5), item(6)], runner, None)
    assert shared.cached == [True, False] and (shared.hits, shared.misses) == (1, 1)
    assert runner.calls[-1] == ["key-6"]
    assert float(shared.results[0][0]) == 5.0


async def test_identical_items_in_flight_are_computed_once(redis: ArqRedis) -> None:
    gateway = ResultGateway(redis, ttl_s=60)
    runner = Runner()
    runner.release.clear()
    first = asyncio.create_task(gateway.resolve("m", [item(7), item(8)], runner, None))
    await running(runner, 1)
    second = asyncio.create_task(gateway.resolve("m", [item(8), item(9)], runner, None))
    await running(runner, 2)
    runner.release.set()
    _, b = await asyncio.gather(first, second)
    assert runner.calls == [["key-7", "key-8"], ["key-9"]]  # key-8 waited for the first run
    assert [float(r[0]) for r in b.results] == [8.0, 9.0]
    assert b.misses == 2  # waiting for work in flight is no cache hit


async def test_errors_are_answered_but_never_cached(redis: ArqRedis) -> None:
    local = LocalResults(1 << 20, 60)
    gateway = ResultGateway(redis, ttl_s=60, local=local)
    failing = Runner(fail=True)
    got = await gateway.resolve("m", [item(10)], failing, None)
    assert isinstance(got.results[0], ItemError) and got.results[0].code == "forward_failed"
    assert await redis.exists(keys.result_key("m", "key-10")) == 0
    assert local.get("m", "key-10") is None
    runner = Runner()
    await gateway.resolve("m", [item(10)], runner, None)
    assert runner.calls == [["key-10"]]  # asked again, run again


async def test_a_runner_that_stored_its_results_is_not_written_twice(redis: ArqRedis) -> None:
    gateway = ResultGateway(redis, ttl_s=60)
    got = await gateway.resolve("m", [item(11)], Runner(stored=True), None)
    assert float(got.results[0][0]) == 11.0
    assert await redis.exists(keys.result_key("m", "key-11")) == 0


async def test_a_lost_result_is_an_item_error_and_a_slow_one_times_out(redis: ArqRedis) -> None:
    gateway = ResultGateway(redis, ttl_s=60)

    class Loses:
        async def run_misses(self, deployment: str, misses: list[WorkItem], job: None) -> Ran:
            return Ran([None for _ in misses])

    loses = Loses()

    lost = await gateway.resolve("m", [item(12)], loses, None)
    assert isinstance(lost.results[0], ItemError) and lost.results[0].code == "deadline_exceeded"

    runner = Runner()
    runner.release.clear()
    owner = asyncio.create_task(gateway.resolve("m", [item(13)], runner, None))
    await running(runner, 1)
    waiter = await gateway.resolve("m", [item(13)], runner, None, timeout_s=0.05)
    assert isinstance(waiter.results[0], ItemError) and waiter.results[0].code == "deadline_exceeded"
    runner.release.set()
    assert float((await owner).results[0][0]) == 13.0


async def test_the_runner_failing_releases_everyone_waiting(redis: ArqRedis) -> None:
    gateway = ResultGateway(redis, ttl_s=60)
    started = asyncio.Event()

    class Raises:
        async def run_misses(self, deployment: str, misses: list[WorkItem], job: None) -> Ran:
            started.set()
            await asyncio.sleep(0.05)
            raise RuntimeError("no worker")

    raises = Raises()

    owner = asyncio.create_task(gateway.resolve("m", [item(14)], raises, None))
    await started.wait()
    waiter = asyncio.create_task(gateway.resolve("m", [item(14)], Runner(), None))
    try:
        await owner
    except RuntimeError:
        pass
    else:
        raise AssertionError("the runner's error must reach its caller")
    # The waiter does not inherit the owner's failure: it runs the item itself, in its own time.
    result = (await asyncio.wait_for(waiter, 1)).results[0]
    assert not isinstance(result, ItemError) and float(result[0]) == 14.0


async def test_a_cancelled_owner_leaves_its_waiters_to_run_the_item(redis: ArqRedis) -> None:
    """A client that disconnects (its request cancelled) must not fail an identical request
    from another caller that was waiting on the same item."""
    gateway = ResultGateway(redis, ttl_s=60)
    stalled = Runner()
    stalled.release.clear()
    owner = asyncio.create_task(gateway.resolve("m", [item(15)], stalled, None))
    await running(stalled, 1)
    runner = Runner()
    waiter = asyncio.create_task(gateway.resolve("m", [item(15)], runner, None, timeout_s=5))
    await asyncio.sleep(0.05)  # its lookup; one not done yet would find nothing in flight: the same run
    owner.cancel()
    result = (await asyncio.wait_for(waiter, 2)).results[0]
    assert not isinstance(result, ItemError) and float(result[0]) == 15.0
    assert runner.calls == [["key-15"]]

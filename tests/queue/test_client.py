"""The app's queue client in process, against a real Redis and an in-process device worker."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import numpy as np
import pytest
from arq.connections import ArqRedis
from arq.constants import job_key_prefix
from litestar import Request

from vllm_srun.app.responses import unless_disconnected
from vllm_srun.errors import NotReady, Unavailable
from vllm_srun.plugins.base import ItemError, LoadedModel, WorkItem
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys, protocol
from vllm_srun.queue import workers as queue_workers
from vllm_srun.queue.client import QueueClient, Submission
from vllm_srun.queue.results import encode_result
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[QueueClient]:
    client = QueueClient(redis_url, result_ttl_s=60)
    await client.start()
    yield client
    await client.close()


Planner = Callable[..., list[WorkItem]]


async def submit(
    client: QueueClient, model: LoadedModel, items: list[WorkItem], timeout_s: float = 5.0
) -> Submission:
    return await client.submit(
        model.info.name, model.info.model_sha256, items, numerics=model.info.numerics, timeout_s=timeout_s
    )


async def test_without_a_worker_a_miss_is_not_ready(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    with pytest.raises(NotReady):
        await submit(client, keywords_model, classify_items("refund"))
    assert (await submit(client, keywords_model, [])).results == []


async def test_misses_are_forwarded_once_then_answered_from_the_caches(
    client: QueueClient,
    worker: DeviceWorker,
    redis_url: str,
    keywords_model: LoadedModel,
    batches: list[int],
    classify_items: Planner,
) -> None:
    items = classify_items("refund my invoice", "parcel delivery", "refund my invoice")
    started = time.monotonic()
    first = await submit(client, keywords_model, items)
    assert time.monotonic() - started < 2.0  # woken by push, not the worker's 5 s poll
    assert (first.hits, first.misses) == (0, 3) and sum(batches) == 2  # the repeated text ran once
    for got, want in zip(first.results, keywords_model.run(items), strict=True):
        np.testing.assert_array_equal(got, want)
    assert first.forward_s >= 0 and first.queue_s >= 0

    again = await submit(client, keywords_model, items)  # this process's copy
    assert (again.hits, again.misses) == (3, 0) and sum(batches) == 2

    other = QueueClient(redis_url, result_ttl_s=60, local_cache_bytes=0)  # another replica
    await other.start()
    try:
        shared = await submit(other, keywords_model, items)
    finally:
        await other.close()
    assert shared.hits == 3 and sum(batches) == 2
    np.testing.assert_array_equal(shared.results[1], first.results[1])


async def test_concurrent_requests_for_the_same_text_share_one_forward(
    client: QueueClient,
    worker: DeviceWorker,
    keywords_model: LoadedModel,
    batches: list[int],
    classify_items: Planner,
) -> None:
    items = classify_items("charge on my invoice")
    answers = await asyncio.gather(*(submit(client, keywords_model, items) for _ in range(5)))
    assert sum(batches) == 1
    assert sum(a.misses for a in answers) == 5  # waiting on work in flight is not a hit
    for answer in answers:
        np.testing.assert_array_equal(answer.results[0], answers[0].results[0])


async def test_a_request_nobody_answers_times_out_per_item(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    # A worker that heartbeats but never takes the job (it died after its last beat).
    name = keywords_model.info.name
    await client.redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) + 60_000})
    got = await submit(client, keywords_model, classify_items("refund"), timeout_s=0.3)
    result = got.results[0]
    assert isinstance(result, ItemError) and result.code == "deadline_exceeded"
    # Nobody waits for it any more: the job left the queue rather than run for no one.
    assert await client.redis.zcard(keys.queue_name(name)) == 0


async def test_a_result_stored_without_a_reply_is_found_by_the_fallback(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    # The reply message was lost, but the result reached the cache: the slow poll finds it.
    name = keywords_model.info.name
    items = classify_items("parcel")
    await _ghost(client, name)
    task = asyncio.create_task(submit(client, keywords_model, items, timeout_s=5.0))
    await _queued(client, name)  # it looked the caches up and waits on its job
    array = await _store(client, keywords_model, items[0])
    got = await asyncio.wait_for(task, 4)
    np.testing.assert_array_equal(got.results[0], array)


async def test_a_cancelled_request_takes_its_job_out_of_the_queue(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    name = keywords_model.info.name
    await client.redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) + 60_000})
    task = asyncio.create_task(submit(client, keywords_model, classify_items("refund")))
    await _queued(client, name)
    assert await client.redis.zcard(keys.queue_name(name)) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.redis.zcard(keys.queue_name(name)) == 0


async def _queued(client: QueueClient, name: str, timeout_s: float = 10.0) -> None:
    """Until a job is on `name`'s queue (a request reached it); fails past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await client.redis.zcard(keys.queue_name(name)):
        assert time.monotonic() < deadline, f"no job on {name}'s queue in {timeout_s} s"
        await asyncio.sleep(0.01)


async def _queued_jobs(client: QueueClient, name: str) -> list[protocol.JobPayload]:
    """The payloads of the jobs waiting in `name`'s queue, as a worker would read them."""
    ids = await client.redis.zrange(keys.queue_name(name), 0, -1)
    bodies = [await client.redis.get(job_key_prefix + job_id.decode()) for job_id in ids]
    return [protocol.decode_job(protocol.deserialize(body)["a"][0]) for body in bodies if body]


async def _store(client: QueueClient, model: LoadedModel, item: WorkItem) -> np.ndarray:
    """`item`'s result, computed here and stored where a worker would store it."""
    array: np.ndarray = model.run([item])[0]
    await client.redis.set(keys.result_key(model.info.name, item.cache_key), encode_result(array))
    return array


async def _ghost(client: QueueClient, name: str) -> None:
    """A worker that heartbeats but never takes a job: what the app queued stays visible."""
    await client.redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) + 60_000})


async def test_the_misses_of_one_tick_are_one_job_and_each_request_withdraws_its_own(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    name = keywords_model.info.name
    await _ghost(client, name)
    texts = ["refund", "parcel", "invoice late", "refund parcel"]
    tasks = [asyncio.create_task(submit(client, keywords_model, classify_items(t))) for t in texts]
    await _queued(client, name)
    (job,) = await _queued_jobs(client, name)
    assert len(job.items) == 4 and job.parts is not None
    assert [part.end for part in job.parts] == [1, 2, 3, 4]
    # A client gone: its part is withdrawn, but the job stays while others wait for it.
    tasks[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    assert await client.redis.zcard(keys.queue_name(name)) == 1
    for task in tasks[1:]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert await client.redis.zcard(keys.queue_name(name)) == 0


async def test_the_tick_job_answers_every_request_from_one_forward(
    client: QueueClient,
    worker: DeviceWorker,
    keywords_model: LoadedModel,
    batches: list[int],
    classify_items: Planner,
) -> None:
    texts = ["refund my invoice", "parcel delivery", "charge twice", "refund my invoice"]
    answers = await asyncio.gather(*(submit(client, keywords_model, classify_items(t)) for t in texts))
    assert sum(batches) == 3  # the repeated text ran once, with the others
    for text, answer in zip(texts, answers, strict=True):
        np.testing.assert_array_equal(answer.results[0], keywords_model.run(classify_items(text))[0])


async def test_stored_results_are_found_by_the_script_that_would_queue_the_misses(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    name = keywords_model.info.name
    await _ghost(client, name)
    stored, missing = classify_items("refund", "parcel")
    array = await _store(client, keywords_model, stored)

    hit = await submit(client, keywords_model, [stored])  # found: nothing is queued
    assert (hit.hits, hit.misses) == (1, 0) and hit.cached == [True]
    np.testing.assert_array_equal(hit.results[0], array)
    assert await client.redis.zcard(keys.queue_name(name)) == 0

    other = QueueClient(client.redis_url, result_ttl_s=60, local_cache_bytes=0)
    await other.start()
    try:
        task = asyncio.create_task(submit(other, keywords_model, [stored, missing], timeout_s=0.5))
        await _queued(client, name)
        (job,) = await _queued_jobs(client, name)  # only the miss runs
        assert [item.cache_key for item in job.items] == [missing.cache_key]
        mixed = await task
    finally:
        await other.close()
    assert (mixed.hits, mixed.misses) == (1, 1) and mixed.cached == [True, False]
    np.testing.assert_array_equal(mixed.results[0], array)
    result = mixed.results[1]
    assert isinstance(result, ItemError) and result.code == "deadline_exceeded"


async def test_a_part_withdrawn_before_any_worker_claims_its_job_does_not_run(
    client: QueueClient,
    redis_url: str,
    deployment: Deployment,
    stats: Stats,
    keywords_model: LoadedModel,
    batches: list[int],
    classify_items: Planner,
) -> None:
    name = keywords_model.info.name
    await _ghost(client, name)
    gone_items = classify_items("refund", "parcel", "invoice late")
    kept_items = classify_items("charge twice")
    gone = asyncio.create_task(submit(client, keywords_model, gone_items))
    kept = asyncio.create_task(submit(client, keywords_model, kept_items, timeout_s=10.0))
    await _queued(client, name)
    (job,) = await _queued_jobs(client, name)
    assert len(job.items) == 4  # one job carries both requests
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await client.redis.zcard(keys.queue_name(name)) == 1  # the other still waits for it
    # Only now does a worker claim the job: it never heard the cancel message, yet the
    # withdrawn part does not run and nothing of it is stored.
    worker = DeviceWorker(redis_url=redis_url, deployments=[deployment], stats=stats, poll_delay_s=5.0)
    await worker.start()
    try:
        got = await asyncio.wait_for(kept, 5.0)
    finally:
        await worker.close()
    np.testing.assert_array_equal(got.results[0], keywords_model.run(kept_items)[0])
    assert sum(batches) == 1
    assert await client.redis.exists(*(keys.result_key(name, i.cache_key) for i in gone_items)) == 0


async def test_a_stopping_client_still_answers_what_the_shared_cache_holds(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    name = keywords_model.info.name
    await _ghost(client, name)
    stored, missing = classify_items("refund", "parcel")
    array = await _store(client, keywords_model, stored)
    client.refuse("the server is stopping")
    hit = await submit(client, keywords_model, [stored])  # nothing to run: answered
    assert hit.cached == [True]
    np.testing.assert_array_equal(hit.results[0], array)
    with pytest.raises(Unavailable, match="stopping"):  # something to run: refused
        await submit(client, keywords_model, [stored, missing])
    assert await client.redis.zcard(keys.queue_name(name)) == 0


async def test_a_request_found_whole_is_answered_when_queueing_the_others_fails(
    client: QueueClient, keywords_model: LoadedModel, classify_items: Planner
) -> None:
    name = keywords_model.info.name
    await _ghost(client, name)
    stored, missing = classify_items("refund", "parcel")
    array = await _store(client, keywords_model, stored)
    # Redis refuses the job's queue entry (the queue key holds a string): the request that needs
    # a forward fails, the one whose results were found in the same step has them in hand.
    await client.redis.set(keys.queue_name(name), b"not a queue")
    found, failed = await asyncio.gather(
        submit(client, keywords_model, [stored]),
        submit(client, keywords_model, [missing]),
        return_exceptions=True,
    )
    assert isinstance(failed, Exception)
    assert isinstance(found, Submission) and found.cached == [True]
    np.testing.assert_array_equal(found.results[0], array)


async def test_a_worker_check_that_fails_after_its_requests_left_logs_nothing(
    keywords_model: LoadedModel, classify_items: Planner
) -> None:
    # A Redis that takes the check's command and drops the connection a moment later, once the
    # only request waiting on it has gone.
    received = asyncio.Event()

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        received.set()
        # The request is cancelled as soon as the command is here: any delay puts the drop after
        # it (one event loop runs both, its timers in order).
        await asyncio.sleep(0.2)
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    loop.set_exception_handler(lambda _, context: reported.append(str(context.get("message"))))
    client = QueueClient(f"redis://127.0.0.1:{port}", local_cache_bytes=0)
    try:
        task = asyncio.create_task(submit(client, keywords_model, classify_items("refund")))
        await asyncio.wait_for(received.wait(), 10)  # the check's command was sent
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        del task  # its traceback holds the check
        deadline = time.monotonic() + 10
        while client.workers._worker_checks:  # the check ends (failed) on its own
            assert time.monotonic() < deadline, "the worker check never ended"
            await asyncio.sleep(0.05)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
        await client.close()
        server.close()
    assert not [message for message in reported if "never retrieved" in message]


def at_once(work: Coroutine[Any, Any, Any]) -> Any:
    """What `work` returns when it runs to its end without waiting once (the event loop never
    runs in between); fails if it would wait."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value
    work.close()
    raise AssertionError("it waited")


async def test_a_requests_meta_reads_the_engines_without_a_round_trip_of_its_own(
    client: QueueClient, redis: ArqRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "described"
    said = {"engine_paths": ["native"], "memory_bytes": {"native": 1}}
    await redis.zadd(keys.worker_key(name), {"w": int(time.time() * 1000) + 60_000})
    await redis.hset(keys.engines_key(name), "w", json.dumps(said))  # type: ignore[misc]
    assert await client.workers.recent_engines(name) == said  # the first request waits for the read
    now = {"engine_paths": ["native", "native-small-batch"], "memory_bytes": {"native": 2}}
    await redis.hset(keys.engines_key(name), "w", json.dumps(now))  # type: ignore[misc]
    assert at_once(client.workers.recent_engines(name)) == said  # read less than ENGINES_TTL_S ago
    # Once it is older, it is still answered at once, while one read refreshes it.
    monkeypatch.setattr(queue_workers, "ENGINES_TTL_S", 0.0)
    assert at_once(client.workers.recent_engines(name)) == said
    assert len(client.workers._engines_reading) == 1
    deadline = time.monotonic() + 10
    while at_once(client.workers.recent_engines(name)) != now:
        assert time.monotonic() < deadline, "the engines were never read again"
        await asyncio.sleep(0.02)
    assert await client.workers.engines(name) == now  # the card's own read stays fresh


async def test_a_request_found_whole_in_this_process_is_answered_without_waiting(
    client: QueueClient,
    worker: DeviceWorker,
    keywords_model: LoadedModel,
    classify_items: Planner,
) -> None:
    items = classify_items("refund my invoice", "parcel delivery")
    first = await submit(client, keywords_model, items)
    # Held by this process: neither the lookup nor the wrapper that watches the client waits
    # for a turn of the event loop, which under load runs every other request's step first.
    stored = at_once(unless_disconnected(_request(_Client()), submit(client, keywords_model, items)))
    done, again = stored
    assert done and again.hits == 2
    for got, want in zip(again.results, first.results, strict=True):
        np.testing.assert_array_equal(got, want)


async def test_work_whose_client_leaves_is_cancelled_and_its_caller_goes_on() -> None:
    peer = _Client()
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.sleep(30)  # work that outlasts the test: only a cancel ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def handler() -> tuple[bool, str | None]:
        outcome = await unless_disconnected(_request(peer), work())
        await asyncio.sleep(0)  # the caller's own cancel was taken back: it goes on
        return outcome

    task = asyncio.create_task(handler())
    await asyncio.wait_for(started.wait(), 5)
    peer.leave()
    assert await asyncio.wait_for(task, 5) == (False, None)
    assert cancelled.is_set() and not task.cancelled()
    # A caller cancelled from outside (not by the client leaving) stays cancelled.
    started.clear()
    outer = asyncio.create_task(unless_disconnected(_request(_Client()), work()))
    await asyncio.wait_for(started.wait(), 5)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer


class _Client:
    """The ASGI side of a client: its body was read; `leave` disconnects it."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}


def _request(peer: _Client) -> Request[Any, Any, Any]:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b"", "state": {}}
    return Request(scope, receive=peer.receive)  # type: ignore[arg-type]

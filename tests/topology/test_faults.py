"""Faults on the compose topology (redis, 2 app replicas, 2 workers), started as processes."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import redis
from helpers import RedisProcess, Topology, metric, submit_job, wait_healthy, write_keywords

from vllm_srun.queue import keys

# A batching window long enough to keep items queued while a test watches them.
BATCH_WAIT_MS = 1500


def bulk_lines(n: int) -> list[dict]:
    """n distinct requests: each text has its own term counts, so none repeats another."""
    return [
        {"input": [f"{'refund ' * (1 + i % 97)}{'parcel ' * (1 + i // 97)}x"], "custom_id": f"r{i}"}
        for i in range(n)
    ]


class EventReader(threading.Thread):
    """Reads a job's SSE stream, reconnecting with Last-Event-ID if the connection drops."""

    def __init__(self, url: str, job_id: str) -> None:
        super().__init__(daemon=True)
        self.url, self.job_id = url, job_id
        self.results: list[dict] = []
        self.status: str | None = None
        self.last_id: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 240
        try:
            while self.status is None and time.monotonic() < deadline:
                headers = {"last-event-id": self.last_id} if self.last_id else {}
                try:
                    self._read(headers)
                except httpx.HTTPError:
                    time.sleep(0.5)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _read(self, headers: dict[str, str]) -> None:
        with httpx.stream(
            "GET", f"{self.url}/v1/jobs/{self.job_id}/events", headers=headers, timeout=60
        ) as r:
            event = None
            for line in r.iter_lines():
                if line.startswith("id:"):
                    self.last_id = line[3:].strip()
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data = json.loads(line[5:].strip())
                    if event == "result":
                        self.results.append(data)
                    elif event == "status":
                        self.status = data["status"]
                        return


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_bulk_job_of_20000_survives_a_worker_kill(topology: Callable[..., Topology], tmp_path: Path) -> None:
    # Default settings: the dead worker's leases lapse in seconds, not after arq's job timeout.
    topo = topology(write_keywords(tmp_path / "kw"))
    first, second = topo.apps
    lines = bulk_lines(20_000)
    job_id = submit_job(first.url, lines)
    reader = EventReader(second.url, job_id)
    reader.start()
    wait_for(lambda: len(reader.results) > 2000, 120, "the first results")
    topo.workers[0].stop(signal.SIGKILL)
    killed = time.monotonic()
    reader.join(timeout=240)
    assert reader.error is None and reader.status == "completed", (reader.status, reader.error)
    assert time.monotonic() - killed < 60, "the job completes within 60 s of the kill"
    indices = [r["index"] for r in reader.results]
    assert len(indices) == 20_000 and len(set(indices)) == 20_000, "every result streamed exactly once"
    status = httpx.get(f"{second.url}/v1/jobs/{job_id}").json()
    assert status["counts"] == {
        "total": 20_000,
        "done": 20_000,
        "failed": 0,
        "cached": status["counts"]["cached"],
    }
    stored = httpx.get(
        f"{first.url}/v1/jobs/{job_id}/results?limit=100000",
        headers={"accept": "application/x-ndjson"},
        timeout=60,
    ).content.splitlines()
    assert [json.loads(line)["index"] for line in stored] == list(range(20_000))
    assert [json.loads(line)["custom_id"] for line in stored[:3]] == ["r0", "r1", "r2"]
    # Byte-identical to what the interactive surface answers for the same request.
    for index in random.Random(0).sample(range(20_000), 200):
        request = {k: v for k, v in lines[index].items() if k != "custom_id"}
        interactive = httpx.post(f"{second.url}/v1/classify", json=request, timeout=30)
        assert stored[index] == b'{"index":%d,"custom_id":"r%d","response":%s}' % (
            index,
            index,
            interactive.content,
        )


@pytest.mark.slow
def test_a_job_outlives_the_replica_that_created_it(
    topology: Callable[..., Topology], tmp_path: Path
) -> None:
    topo = topology(write_keywords(tmp_path / "kw"))
    creator, other = topo.apps
    job_id = submit_job(creator.url, bulk_lines(3000))
    creator.stop(signal.SIGKILL)
    reader = EventReader(other.url, job_id)
    reader.start()
    reader.join(timeout=120)
    assert reader.status == "completed" and len({r["index"] for r in reader.results}) == 3000
    results = httpx.get(f"{other.url}/v1/jobs/{job_id}/results?offset=2990&limit=20").json()
    assert [r["index"] for r in results["data"]] == list(range(2990, 3000)) and results["has_more"] is False


def test_stopping_redis_fails_fast_and_recovers(topology: Callable[..., Topology], tmp_path: Path) -> None:
    topo = topology(write_keywords(tmp_path / "kw"))
    for app in topo.apps:
        assert app.post("/v1/classify", {"input": "refund"}).status_code == 200
    port = topo.redis.port
    topo.redis.stop()
    for app in topo.apps:
        started = time.monotonic()
        down = app.post("/v1/classify", {"input": "refund again"})
        assert down.status_code == 503 and down.json()["error"]["code"] == "not_ready"
        assert time.monotonic() - started < 5
    topo.redis = RedisProcess(tmp_path / "redis-again.log", port=port)
    for i, app in enumerate(topo.apps):
        wait_healthy(app, 30)

        def answered(app=app, i=i) -> bool:
            r = app.post("/v1/classify", {"input": f"parcel {'refund ' * (i + 1)}"})
            return r.status_code == 200

        wait_for(answered, 30, "the replica to serve again")
    assert all(w.alive() for w in topo.workers)


def test_deadline_and_disconnect_drop_queued_items(topology: Callable[..., Topology], tmp_path: Path) -> None:
    # A batch-variant model and a long batching window keep items queued long enough to watch.
    topo = topology(
        write_keywords(tmp_path / "kw", "batching"), worker_args=("--batch-wait-ms", str(BATCH_WAIT_MS))
    )
    app = topo.apps[0]
    # One worker, so every request below meets the same coalescer: a first request after a
    # quiet spell runs at once, and the window opens for the ones right behind it.
    topo.workers[1].stop()
    metrics_url = topo.worker_metrics[0]
    assert app.post("/v1/classify", {"input": "charge"}).status_code == 200
    baseline = metric(httpx.get(metrics_url).text, "vllm_srun_batch_size_sum")
    late = app.post("/v1/classify", {"input": "refund", "options": {"deadline_ms": 200}})
    assert late.status_code == 200
    assert late.json()["results"][0]["error"] == "deadline_exceeded"
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{app.url}/v1/classify", json={"input": "parcel delivery"}, timeout=0.3)
    # A negative check: past the batching window (with a second's margin), a queued item would
    # have run by now.
    time.sleep(BATCH_WAIT_MS / 1000 + 1.0)
    rows = metric(httpx.get(metrics_url).text, "vllm_srun_batch_size_sum")
    assert rows == baseline, "the expired and the withdrawn item never ran"
    ok = app.post("/v1/classify", {"input": "invoice"})
    assert ok.json()["results"][0]["label"] == "billing"


def test_admission_refuses_whole_requests(topology: Callable[..., Topology], tmp_path: Path) -> None:
    topo = topology(
        write_keywords(tmp_path / "kw", "batching"),
        worker_args=("--batch-wait-ms", str(BATCH_WAIT_MS)),
        app_args=("--max-queued-items", "4", "--max-queued-tokens", "20"),
    )
    topo.workers[1].stop()  # one coalescer: the held request below waits in its batching window
    app = topo.apps[0]
    # A request the bounds can never admit is a 413 to split it, not a 429 to retry forever.
    too_many = app.post("/v1/classify", {"input": ["refund"] * 5})
    assert too_many.status_code == 413 and "--max-queued-items" in too_many.json()["error"]["message"]
    too_long = app.post("/v1/classify", {"input": ["refund " * 21]})
    assert too_long.status_code == 413 and "tokens" in too_long.json()["error"]["message"]
    # Under load: right behind a first request, three items wait in the worker's batching window,
    # holding three of the four slots; two more do not fit, one does.
    assert app.post("/v1/classify", {"input": "charge"}).status_code == 200
    state = redis.Redis.from_url(topo.redis.url)
    queued = keys.queue_name("kw")
    wait_for(lambda: state.zcard(queued) == 0, 10, "the first request's job to leave the queue")
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(app.post, "/v1/classify", {"input": ["refund", "parcel", "invoice"]})
        # Admitted once its job is on the queue (a job stays there until it is done).
        wait_for(lambda: state.zcard(queued) == 1, 10, "the three items to be queued")
        busy = app.post("/v1/classify", {"input": ["refund", "parcel"]})
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1", busy.text
        assert "2 items queued" not in busy.text and "queued" in busy.json()["error"]["message"]
        one_more = pool.submit(app.post, "/v1/classify", {"input": ["delivery"]})
        assert held.result().status_code == 200 and len(held.result().json()["results"]) == 3
        assert one_more.result().json()["results"][0]["label"] == "shipping"
    state.close()
    fits = app.post("/v1/classify", {"input": ["refund"] * 4})
    assert fits.status_code == 200 and len(fits.json()["results"]) == 4


def test_a_batch_survives_a_worker_kill_each_custom_id_once(
    topology: Callable[..., Topology], tmp_path: Path
) -> None:
    topo = topology(write_keywords(tmp_path / "kw"))
    first, second = topo.apps
    rows = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/classify", "body": {"input": line["input"]}}
        for i, line in enumerate(bulk_lines(4000))
    ]
    content = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
    client = openai.OpenAI(base_url=f"{first.url}/v1", api_key="unused")
    upload = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/classify", completion_window="24h")
    other = openai.OpenAI(base_url=f"{second.url}/v1", api_key="unused")
    wait_for(
        lambda: (other.batches.retrieve(batch.id).request_counts.completed or 0) > 200, 60, "first results"
    )
    topo.workers[0].stop(signal.SIGKILL)
    wait_for(lambda: other.batches.retrieve(batch.id).status == "completed", 60, "the batch to complete")
    done = other.batches.retrieve(batch.id)
    assert done.request_counts is not None and done.request_counts.completed == 4000
    assert done.output_file_id is not None
    ids = [
        json.loads(line)["custom_id"] for line in other.files.content(done.output_file_id).text.splitlines()
    ]
    assert len(ids) == 4000 and set(ids) == {f"r{i}" for i in range(4000)}, "each custom_id answered once"

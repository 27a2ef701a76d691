"""Dead workers and poison inputs on real processes: Redis, one app replica, two device workers.

The workers serve the keyword model on a test engine, installed as a real distribution on
PYTHONPATH, that misbehaves on marker rows: a row that starts with six "invoice" takes SLOW_S in
its forward (work held while a worker is killed), one that starts with six "delivery" ends the
process with os._exit(1) (a poison input). Default lease settings throughout.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from helpers import (
    Proc,
    RedisProcess,
    Server,
    plugin_path,
    start_worker,
    submit_job,
    wait_healthy,
    write_keywords,
)

from vllm_srun import defaults
from vllm_srun.queue import keys

# A forward that outlasts a lease (and its renewal), so only a lease lapse or a release can
# free the work a killed worker held.
SLOW_S = 2 * defaults.LEASE_S
SLOW = "invoice " * 6
POISON = "delivery " * 6

ENGINE = f"""
import os
import time

from vllm_sr_example.engine import CountsEngine, CountsModel

# The keyword model's term ids: charge 1, delivery 2, invoice 3, parcel 4, refund 5.
SLOW, POISON = [3] * 6, [2] * 6


class FaultyModel(CountsModel):
    def encode(self, batch):
        rows = [[int(t) for t in batch.row(i)[:6]] for i in range(len(batch))]
        if POISON in rows:
            os._exit(1)  # what a segfault or the OOM killer does: no exception, no cleanup
        if SLOW in rows:
            time.sleep({SLOW_S})
        return super().encode(batch)


class FaultyEngine(CountsEngine):
    auto_priority = 1  # chosen before example_counts (lower first) wherever this is installed

    def load(self, spec, device, dtype, host):
        return FaultyModel(int(spec.config["vocab_size"]), device, dtype)
"""


class Cluster:
    """Redis, one app replica and two workers; `supervise` restarts workers that die."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.package = write_keywords(tmp_path / "kw")
        self.redis = RedisProcess(tmp_path / "redis.log")
        self.app = Server([str(self.package), "--redis", self.redis.url], tmp_path / "app.log")
        self.workers: list[Proc] = []
        self.restarts = 0
        self._supervising = False
        self._supervisor: threading.Thread | None = None

    def start_worker(self) -> Proc:
        worker = start_worker(self.tmp_path, self.package, self.redis.url)
        self.workers.append(worker)
        return worker

    def ready(self) -> None:
        self.app.wait_ready()
        wait_healthy(self.app)

    def supervise(self) -> None:
        """Restart a dead worker, as a production supervisor (systemd, Kubernetes) does."""
        self._supervising = True

        def loop() -> None:
            while self._supervising:
                for index, worker in enumerate(list(self.workers)):
                    if not worker.alive() and self._supervising:
                        self.workers[index] = start_worker(self.tmp_path, self.package, self.redis.url)
                        self.restarts += 1
                time.sleep(0.2)

        self._supervisor = threading.Thread(target=loop, daemon=True)
        self._supervisor.start()

    def live(self) -> int:
        return sum(worker.alive() for worker in self.workers)

    def held(self, queue: str) -> int:
        """Jobs workers hold (leased) from the model's interactive or bulk queue."""
        client = redis.Redis.from_url(self.redis.url)
        try:
            name = keys.queue_name("kw") if queue == "queue" else keys.bulk_queue_name("kw")
            return int(client.zcard(keys.lease_key(name)))
        finally:
            client.close()

    def stop(self) -> None:
        self._supervising = False
        if self._supervisor is not None:
            self._supervisor.join(timeout=70)
        for proc in [self.app, *self.workers]:
            proc.stop()
        self.redis.stop()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    entry_points = {"vllm_srun.engines": {"faulty_counts": "faulty_counts:FaultyEngine"}}
    monkeypatch.setenv("PYTHONPATH", plugin_path(tmp_path, "faulty-counts", entry_points, ENGINE))
    made = Cluster(tmp_path)
    yield made
    made.stop()


def bulk_lines(n: int, poison_at: int | None = None) -> list[dict[str, Any]]:
    """n distinct requests (each text has its own term counts); one poison line if asked."""
    lines = [
        {"input": [f"{'refund ' * (1 + i % 97)}{'parcel ' * (1 + i // 97)}x"], "custom_id": f"r{i}"}
        for i in range(n)
    ]
    if poison_at is not None:
        lines[poison_at]["input"] = [POISON + "refund"]
    return lines


def job(url: str, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json())


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds it took; fails the test past `timeout_s`."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


def results(url: str, job_id: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{url}/v1/jobs/{job_id}/results?limit=100000", headers={"accept": "application/x-ndjson"}, timeout=60
    )
    return [json.loads(line) for line in r.content.splitlines()]


def classify(url: str, texts: list[str]) -> httpx.Response:
    return httpx.post(f"{url}/v1/classify", json={"input": texts}, timeout=90)


@pytest.mark.slow
def test_work_held_by_a_killed_worker_runs_again_on_the_other(cluster: Cluster) -> None:
    first = cluster.start_worker()
    cluster.ready()
    url = cluster.app.url
    # Interactive requests whose forward outlasts a lease, held by the worker about to die.
    pool = ThreadPoolExecutor(4)
    slow: list[Future[httpx.Response]] = [
        pool.submit(classify, url, [f"{SLOW}{'refund ' * k}"]) for k in range(4)
    ]
    wait_for(lambda: cluster.held("queue") > 0, 10, "the worker to take the interactive requests")
    # The job comes while the slow forward holds the device, so the chunks the worker takes stay
    # held until it dies. Submitted first, most or all of it could be done by the time the slow
    # requests were taken.
    n = 3000
    job_id = submit_job(url, bulk_lines(n))
    wait_for(lambda: cluster.held("bulk") > 0, 5, "the worker to take bulk chunks")
    cluster.start_worker()
    assert cluster.held("queue") > 0 and cluster.held("bulk") > 0, "the first worker holds both kinds"
    assert job(url, job_id)["status"] in ("queued", "running")
    first.stop(signal.SIGKILL)
    killed = time.monotonic()
    # Fast interactive traffic meanwhile is answered by the live worker.
    for k in range(5):
        fast = classify(url, [f"{'parcel ' * (k + 1)}fast"])
        assert fast.status_code == 200 and fast.json()["results"][0]["label"] == "shipping", fast.text
    took = wait_for(lambda: job(url, job_id)["status"] == "completed", 60, "the job to complete")
    assert took < 60
    for future in slow:
        answer = future.result(timeout=max(1.0, 60 - (time.monotonic() - killed)))
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"][0]["label"] == "billing", answer.text
    assert time.monotonic() - killed < 60, "interactive requests held by the dead worker were retried in time"
    status = job(url, job_id)
    assert (
        status["counts"]["total"] == n and status["counts"]["done"] == n and status["counts"]["failed"] == 0
    )
    stored = results(url, job_id)
    assert [line["index"] for line in stored] == list(range(n)), "each item stored exactly once, in order"
    assert all("response" in line for line in stored)


@pytest.mark.slow
def test_a_poison_input_fails_alone_and_a_worker_stays_up(cluster: Cluster) -> None:
    cluster.start_worker()
    cluster.start_worker()
    cluster.ready()
    cluster.supervise()
    url = cluster.app.url
    n, poison_at = 600, 300
    job_id = submit_job(url, bulk_lines(n, poison_at))
    answer = classify(url, ["refund now", POISON + "parcel", "parcel please"])
    assert answer.status_code == 200, answer.text
    interactive = answer.json()["results"]
    assert interactive[1]["error"] == "unavailable", interactive
    assert [interactive[0]["label"], interactive[2]["label"]] == ["billing", "shipping"], interactive
    wait_for(lambda: job(url, job_id)["status"] in ("completed", "failed"), 60, "the bulk job to finish")
    status = job(url, job_id)
    assert status["status"] == "completed", status
    stored = results(url, job_id)
    assert [line["index"] for line in stored] == list(range(n))
    broken = [line for line in stored if line["response"]["results"][0].get("error")]
    assert [line["index"] for line in broken] == [poison_at], broken[:3]
    assert broken[0]["response"]["results"][0]["error"] == "unavailable"
    assert cluster.restarts >= 1, "the poison input did kill workers"
    assert cluster.live() >= 1
    # Served as before once the restarted workers are up (the poison's last kill may leave no
    # worker serving for a few seconds: /health and requests say 503 not_ready meanwhile).
    wait_healthy(cluster.app, 30)
    after = classify(url, ["invoice charge"])
    assert after.status_code == 200 and after.json()["results"][0]["label"] == "billing"

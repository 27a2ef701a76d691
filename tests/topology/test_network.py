"""A network that misbehaves between the compose topology's processes and their Redis.

Two app replicas and two workers, each reaching Redis through its own fault proxy, with
timeouts shortened by the environment (docs/network.md): latency with jitter, connections
reset every second, and one worker's or one app's link blackholed, then healed. Every scenario
ends with its bulk job complete, each line's result stored exactly once.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from helpers import Proc, RedisProcess, Server, start_worker, submit_job, wait_healthy, write_keywords

from vllm_srun.testing.netfault import ThreadedProxy

# Short enough for the suite: a silent link is noticed within SILENCE_S (plus a read).
SILENCE_S = 2.0
ENV = {
    "VLLM_SRUN_REDIS_CONNECT_S": "1",
    "VLLM_SRUN_REDIS_SOCKET_S": "1.5",
    "VLLM_SRUN_REDIS_HEALTH_CHECK_S": "2",
    "VLLM_SRUN_REDIS_SILENCE_S": str(SILENCE_S),
}
DEADLINE_MS = 4000
_texts = itertools.count()


@dataclass
class Net:
    redis: RedisProcess
    apps: list[Server]
    workers: list[Proc]
    app_links: list[ThreadedProxy]
    worker_links: list[ThreadedProxy]

    @property
    def links(self) -> list[ThreadedProxy]:
        return [*self.app_links, *self.worker_links]

    def heal(self) -> None:
        for link in self.links:
            link.heal()


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    root = tmp_path_factory.mktemp("network")
    package = write_keywords(root / "kw")
    redis = RedisProcess(root / "redis.log")
    upstream = ("127.0.0.1", redis.port)
    app_links = [ThreadedProxy(upstream) for _ in range(2)]
    worker_links = [ThreadedProxy(upstream) for _ in range(2)]
    apps = [
        Server([str(package), "--redis", link.url], root / f"app-{i}.log", ENV)
        for i, link in enumerate(app_links)
    ]
    workers = [start_worker(root, package, link.url, env=ENV) for link in worker_links]
    topo = Net(redis, apps, workers, app_links, worker_links)
    try:
        for app in apps:
            app.wait_ready()
            wait_healthy(app)
        yield topo
    finally:
        for proc in [*apps, *workers]:
            proc.stop()
        for link in topo.links:
            link.close()
        redis.stop()


@pytest.fixture
def healed(net: Net) -> Iterator[Net]:
    """The topology, healed and serving after the test whatever it did."""
    yield net
    net.heal()
    for app in net.apps:
        wait_healthy(app, 20)


class Traffic(threading.Thread):
    """Classify requests of distinct texts (so each runs) to `apps` in turn until stopped;
    each answer's status and time."""

    def __init__(self, apps: list[Server], clients: int = 4) -> None:
        super().__init__(daemon=True)
        self.apps, self.clients = apps, clients
        self.answers: list[tuple[int, float, str]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with ThreadPoolExecutor(self.clients) as pool:
            for _ in pool.map(self._client, range(self.clients)):
                pass

    def _client(self, index: int) -> None:
        app = self.apps[index % len(self.apps)]
        while not self._halt.is_set():
            text = f"refund parcel {next(_texts)} " + "invoice " * (index + 1)
            body = {"input": text, "options": {"deadline_ms": DEADLINE_MS}}
            started = time.monotonic()
            try:
                r = httpx.post(f"{app.url}/v1/classify", json=body, timeout=DEADLINE_MS / 1000 + 10)
                status, detail = r.status_code, r.text[:300]
            except httpx.HTTPError as exc:
                status, detail = 0, repr(exc)
            self.answers.append((status, time.monotonic() - started, detail))

    def stop(self) -> list[tuple[int, float, str]]:
        self._halt.set()
        self.join(timeout=DEADLINE_MS / 1000 + 15)
        return self.answers


def assert_answered_in_time(answers: list[tuple[int, float, str]]) -> None:
    """Each request answered (200) or refused (503) within its deadline and a second; no 500,
    no hang, no dropped connection."""
    assert answers, "the traffic ran"
    wrong = [a for a in answers if a[0] not in (200, 503)]
    assert not wrong, wrong[:5]
    late = [a for a in answers if a[1] > DEADLINE_MS / 1000 + 1.0]
    assert not late, late[:5]


def assert_job_whole(url: str, job_id: str, total: int, timeout_s: float = 60) -> None:
    """The job completes with every line's result stored once, none failed."""
    deadline = time.monotonic() + timeout_s
    while (status := httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json())["status"] != "completed":
        assert status["status"] in ("queued", "running", "in_progress", "validating"), status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["counts"]["done"] == total and status["counts"]["failed"] == 0, status
    stored = httpx.get(
        f"{url}/v1/jobs/{job_id}/results?limit={total + 10}",
        headers={"accept": "application/x-ndjson"},
        timeout=30,
    ).content.splitlines()
    assert [json.loads(line)["index"] for line in stored] == list(range(total))


def job_lines(n: int, tag: str) -> list[dict]:
    return [{"input": [f"{'refund ' * (1 + i % 31)}{tag} {i} parcel"], "custom_id": f"r{i}"} for i in range(n)]


def test_latency_with_jitter_answers_in_time_or_503(healed: Net) -> None:
    for link in healed.links:
        link.delay(0.2, 0.1)
    job_id = submit_job(healed.apps[1].url, job_lines(300, "lag"), timeout_s=30)
    traffic = Traffic(healed.apps)
    traffic.start()
    time.sleep(4)
    answers = traffic.stop()
    healed.heal()
    assert_answered_in_time(answers)
    assert any(status == 200 for status, _, _ in answers), "a lagging link still serves"
    assert_job_whole(healed.apps[0].url, job_id, 300)


def test_connections_reset_every_second_lose_and_repeat_nothing(healed: Net) -> None:
    job_id = submit_job(healed.apps[0].url, job_lines(1500, "reset"), timeout_s=30)
    for link in healed.links:
        link.reset_every(1.0)
    traffic = Traffic(healed.apps)
    traffic.start()
    time.sleep(3.5)
    answers = traffic.stop()
    healed.heal()
    assert sum(link.proxy.resets for link in healed.links) > 0, "connections were reset"
    assert_answered_in_time(answers)
    assert_job_whole(healed.apps[1].url, job_id, 1500)
    # Once the link is back, everything is answered again.
    for app in healed.apps:
        assert app.post("/v1/classify", {"input": "refund after resets"}).status_code == 200


def test_a_blackholed_worker_loses_its_work_to_the_other_and_rejoins(healed: Net) -> None:
    stuck, other = healed.workers
    job_id = submit_job(healed.apps[0].url, job_lines(3000, "hole"), timeout_s=30)
    healed.worker_links[0].blackhole()
    # The other worker finishes the job, the stuck one's leased chunks included (they lapse).
    assert_job_whole(healed.apps[1].url, job_id, 3000, timeout_s=30)
    while "poll_failed" not in stuck.log():  # it noticed: a configured timeout, not a hang
        time.sleep(0.1)
    healed.worker_links[0].heal()
    deadline = time.monotonic() + 10
    while "poll_recovered" not in stuck.log().split("poll_failed", 1)[1]:
        assert time.monotonic() < deadline, stuck.log()[-3000:]
        time.sleep(0.1)
    assert stuck.alive() and other.alive()


def test_a_blackholed_app_refuses_at_the_deadline_says_why_and_recovers(healed: Net) -> None:
    app, other = healed.apps
    assert app.post("/v1/classify", {"input": "refund before"}).status_code == 200

    def ask(deadline_ms: int) -> tuple[int, float, str]:
        started = time.monotonic()
        body = {"input": f"parcel {next(_texts)}", "options": {"deadline_ms": deadline_ms}}
        r = httpx.post(f"{app.url}/v1/classify", json=body, timeout=deadline_ms / 1000 + 10)
        return r.status_code, time.monotonic() - started, r.text

    healed.app_links[0].blackhole()
    blackholed = time.monotonic()
    # Refused by its deadline, not hung: here as soon as a Redis read times out (a request
    # already waiting for its reply is refused at its deadline: tests/queue/test_replies.py).
    status, took, _ = ask(2500)
    assert status == 503 and took < 2.5 + 0.5, (status, took)
    # Known down within the silence bound: /health says why, and new requests are refused fast.
    while (health := app.get("/health")).status_code == 200:
        assert time.monotonic() - blackholed < SILENCE_S + 3.0, "the silent link was noticed"
        time.sleep(0.1)
    assert health.status_code == 503 and "Redis" in health.json()["reason"], health.text
    while "is down" not in (health := app.get("/health")).text:  # the silence noticed
        assert time.monotonic() - blackholed < SILENCE_S + 3.0, health.text
        time.sleep(0.1)
    status, took, _ = ask(5000)
    assert status == 503 and took < 0.5, (status, took)
    assert other.post("/v1/classify", {"input": "parcel elsewhere"}).status_code == 200
    healed.app_links[0].heal()
    healed_at = time.monotonic()
    wait_healthy(app, 10)
    assert time.monotonic() - healed_at < SILENCE_S + 3.0, "it recovers within seconds of the heal"
    assert app.post("/v1/classify", {"input": "refund after"}).status_code == 200

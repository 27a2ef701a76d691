"""SIGTERM after real load ends `serve` and `worker` within a supervisor's 10 s grace period.

What `docker stop`, Kubernetes and systemd send is SIGTERM, then SIGKILL 10 s later. Each test
loads the server first (a few thousand requests over loopback), then holds what keeps a server
from stopping: an idle keep-alive connection, an open job event stream and a request whose
forward is still running. The forward is made slow by a test engine, installed as a real
distribution on PYTHONPATH, that sleeps on rows starting with six "invoice" in processes where
SRUN_TEST_SLOW is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from helpers import (
    Proc,
    RedisProcess,
    Server,
    metric,
    plugin_path,
    start_worker,
    wait_healthy,
    write_keywords,
)

from vllm_srun import defaults
from vllm_srun.queue import keys

GRACE_S = 10.0  # docker stop's, Kubernetes' default terminationGracePeriodSeconds, systemd's
SLOW = "invoice " * 6
SLOW_S = 30.0  # longer than any stop may take: a stop that waited for it would fail the test

ENGINE = f"""
import os
import time

from vllm_sr_example.engine import CountsEngine, CountsModel

SLOW = [3] * 6  # the keyword model's term id of "invoice", six times


class SlowModel(CountsModel):
    def encode(self, batch):
        rows = [[int(t) for t in batch.row(i)[:6]] for i in range(len(batch))]
        if SLOW in rows and os.environ.get("SRUN_TEST_SLOW"):
            time.sleep({SLOW_S})
        return super().encode(batch)


class SlowEngine(CountsEngine):
    auto_priority = 1  # chosen before example_counts wherever this is installed

    def load(self, spec, device, dtype, host):
        return SlowModel(int(spec.config["vocab_size"]), device, dtype)
"""


@pytest.fixture
def slow_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry_points = {"vllm_srun.engines": {"slow_counts": "slow_counts:SlowEngine"}}
    monkeypatch.setenv("PYTHONPATH", plugin_path(tmp_path, "slow-counts", entry_points, ENGINE))


def load(url: str, n: int = 2000, concurrency: int = 16) -> dict[int, int]:
    """`n` distinct small requests, `concurrency` at a time; the count of each status."""

    async def run() -> dict[int, int]:
        codes: dict[int, int] = {}
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def one(i: int) -> None:
                async with gate:
                    text = f"{'refund ' * (1 + i % 13)}{'parcel ' * (1 + i // 13)}x"
                    r = await client.post("/v1/classify", json={"input": [text, "charge"]})
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1

            await asyncio.gather(*(one(i) for i in range(n)))
        return codes

    return asyncio.run(run())


class Held:
    """What keeps a server from stopping: an idle keep-alive connection, an open job event
    stream, and (where asked) a request whose forward is still running."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.idle = httpx.Client(base_url=url, timeout=30)
        assert self.idle.get("/health/live").status_code == 200  # its connection stays open
        lines = [{"input": [SLOW if i == 0 else f"refund {'parcel ' * i}"]} for i in range(300)]
        created = self.idle.post(
            "/v1/jobs?surface=classify",
            content="\n".join(json.dumps(line) for line in lines),
            headers={"content-type": "application/x-ndjson"},
        )
        assert created.status_code == 202, created.text
        self.job_id = created.json()["id"]
        self.stream_open = threading.Event()
        self.stream_ended = threading.Event()
        self.stream_error: BaseException | None = None
        threading.Thread(target=self._stream, daemon=True).start()
        assert self.stream_open.wait(10), "the event stream opened"
        self.pool = ThreadPoolExecutor(2)

    def _stream(self) -> None:
        try:
            with httpx.stream("GET", f"{self.url}/v1/jobs/{self.job_id}/events", timeout=60) as r:
                assert r.status_code == 200
                self.stream_open.set()
                for _ in r.iter_lines():
                    pass
        except BaseException as exc:  # a dropped connection is a way to end; recorded, not raised
            self.stream_error = exc
        finally:
            self.stream_ended.set()

    def slow_request(self) -> Future[httpx.Response]:
        return self.pool.submit(httpx.post, f"{self.url}/v1/classify", json={"input": [SLOW]}, timeout=60)


def leases(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.zcard(keys.lease_key(keys.queue_name("kw"))))
    finally:
        client.close()


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stop(proc: Proc) -> float:
    """SIGTERM `proc`; seconds until it exited, asserting it exited 0 within the grace period."""
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    try:
        code = proc.proc.wait(timeout=GRACE_S + 5)
    except Exception:
        raise AssertionError(f"still running {GRACE_S + 5} s after SIGTERM:\n{proc.log()[-3000:]}") from None
    took = time.monotonic() - started
    assert code == 0, proc.log()[-3000:]
    assert took < GRACE_S, f"stopped in {took:.1f} s:\n{proc.log()[-3000:]}"
    return took


def test_serve_stops_on_sigterm_after_load(slow_engine: None, tmp_path: Path, procs: list[Proc]) -> None:
    server = Server([str(write_keywords(tmp_path / "kw"))], tmp_path / "serve.log", {"SRUN_TEST_SLOW": "1"})
    procs.append(server)
    server.wait_ready()
    codes = load(server.url)
    assert codes == {200: 2000}, codes
    held = Held(server.url)
    in_flight = held.slow_request()

    def queued() -> bool:  # its job stays on the queue until it is done
        return metric(server.get("/metrics").text, "vllm_srun_queue_depth", model="kw") >= 1

    wait_for(queued, 10, "the slow request to be queued")
    stop(server)
    assert held.stream_ended.is_set(), "the event stream was ended, not left open"
    answer = in_flight.result(timeout=5)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "not_ready", answer.text
    assert "Application shutdown complete" in server.log()


def test_replica_and_worker_stop_on_sigterm(slow_engine: None, tmp_path: Path, procs: list[Proc]) -> None:
    package = write_keywords(tmp_path / "kw")
    redis_proc = RedisProcess(tmp_path / "redis.log")
    procs.append(redis_proc)
    app = Server([str(package), "--redis", redis_proc.url], tmp_path / "app.log")
    procs.append(app)
    os.environ["SRUN_TEST_SLOW"] = "1"  # only the first worker's forwards of SLOW rows sleep
    try:
        slow_worker = start_worker(tmp_path, package, redis_proc.url)
    finally:
        del os.environ["SRUN_TEST_SLOW"]
    procs.append(slow_worker)
    app.wait_ready()
    wait_healthy(app)
    assert load(app.url) == {200: 2000}
    held = Held(app.url)
    in_flight = held.slow_request()
    wait_for(lambda: leases(redis_proc.url) == 1, 10, "the slow worker to take the request")
    procs.append(start_worker(tmp_path, package, redis_proc.url))

    # The worker holding the request stops; the other takes the request at once, not once its
    # lease has lapsed (defaults.LEASE_S), and answers it.
    stopped_at = time.monotonic()
    stop(slow_worker)
    answer = in_flight.result(timeout=30)
    assert answer.status_code == 200 and answer.json()["results"][0]["label"] == "billing", answer.text
    # A lapse frees it no sooner than a lease after its last renewal (at most a renewal period
    # before the stop): the bound that tells a release from a lapse.
    lapse_s = defaults.LEASE_S - defaults.LEASE_RENEW_S
    assert time.monotonic() - stopped_at < lapse_s, "the released request was taken at once"

    # The replica, with an idle keep-alive connection and an open event stream.
    stop(app)
    assert held.stream_ended.is_set()

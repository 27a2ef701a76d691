"""A Redis restart loses no job: `kill -9` the main Redis mid-job, restart it from its file.

The main Redis runs as production runs it (an append-only file, `appendfsync everysec`); an
app replica and a device worker run as processes against it over TCP. While a bulk job runs,
Redis is killed with SIGKILL and started again on the same port from the same directory. The
job must complete with every item exactly once, interactive requests must get 503
`unavailable` during the outage and be served again after it, and neither of our processes may
be restarted. The worker runs the keyword model on a test engine that spends a few
milliseconds per forward, so the job is still running when Redis dies.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import (
    Proc,
    RedisProcess,
    Server,
    free_port,
    plugin_path,
    start_worker,
    wait_healthy,
    write_keywords,
)

from vllm_srun import defaults
from vllm_srun.cli.embedded_redis import find_redis_server
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys
from vllm_srun.queue.client import QueueClient
from vllm_srun.queue.jobs import BulkStore
from vllm_srun.queue.redis import make_pool
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.queue.worker.device_worker import HEARTBEAT_S, Deployment, DeviceWorker
from vllm_srun.registry.loader import ModelOptions, load_model

ENGINE = """
import time

from vllm_sr_example.engine import CountsEngine, CountsModel


class PacedModel(CountsModel):
    def encode(self, batch):
        time.sleep(0.02)  # a forward's worth of time, so a job lasts long enough to interrupt
        return super().encode(batch)


class PacedEngine(CountsEngine):
    auto_priority = 1  # chosen before example_counts wherever this is installed

    def load(self, spec, device, dtype, host):
        return PacedModel(int(spec.config["vocab_size"]), device, dtype)
"""


class DurableRedis(Proc):
    """redis-server with an append-only file in `data`, restartable on the same port."""

    def __init__(self, data: Path, port: int, log_path: Path) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        args = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        args += ["--maxmemory-policy", "noeviction"]
        super().__init__(args, log_path)
        deadline = time.monotonic() + 20
        while True:  # up once it answers PING (it loads the file first)
            try:
                import redis

                if redis.Redis(port=port, socket_timeout=1).ping():
                    return
            except Exception:
                assert self.alive() and time.monotonic() < deadline, self.log()
                time.sleep(0.05)


@pytest.fixture
def paced_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry_points = {"vllm_srun.engines": {"paced_counts": "paced_counts:PacedEngine"}}
    monkeypatch.setenv("PYTHONPATH", plugin_path(tmp_path, "paced-counts", entry_points, ENGINE))


def lines(n: int) -> list[dict[str, Any]]:
    return [
        {"input": [f"{'refund ' * (1 + i % 97)}{'parcel ' * (1 + i // 97)}x"], "custom_id": f"r{i}"}
        for i in range(n)
    ]


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - started


# Long enough for every loop of the worker to meet the failure at least once: a heartbeat and
# two lease renewals.
OUTAGE_S = max(HEARTBEAT_S, 2 * defaults.LEASE_RENEW_S) + 0.5


def in_append_only_file(data: Path, needle: bytes) -> bool:
    """Whether Redis has written `needle` to its append-only file (one file in 6.x, a folder
    of them from 7.0). Written is enough: a SIGKILL leaves what was written to the kernel."""
    return any(needle in path.read_bytes() for path in data.rglob("*.aof"))


def job(url: str, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10)
    return dict(r.json()) if r.status_code == 200 else {"status": f"http {r.status_code}", "counts": {}}


@pytest.mark.slow
def test_a_redis_kill_and_restart_loses_no_job(paced_engine: None, tmp_path: Path, procs: list[Proc]) -> None:
    data = tmp_path / "redis-data"
    data.mkdir()
    port = free_port()
    redis_proc = DurableRedis(data, port, tmp_path / "redis.log")
    procs.append(redis_proc)
    package = write_keywords(tmp_path / "kw")
    app = Server([str(package), "--redis", redis_proc.url], tmp_path / "app.log")
    procs.append(app)
    worker = start_worker(tmp_path, package, redis_proc.url)
    procs.append(worker)
    app.wait_ready()
    wait_healthy(app)
    assert app.post("/v1/classify", {"input": "refund"}).status_code == 200

    n = 12_000
    created = httpx.post(
        f"{app.url}/v1/jobs?surface=classify",
        content="\n".join(json.dumps(line) for line in lines(n)),
        headers={"content-type": "application/x-ndjson"},
        timeout=60,
    )
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    wait_for(lambda: job(app.url, job_id)["counts"].get("done", 0) >= 1500, 60, "the job to be under way")
    # The job's creation is in the file: it must survive.
    wait_for(lambda: in_append_only_file(data, job_id.encode()), 10, "the job in the append-only file")

    before = job(app.url, job_id)
    redis_proc.stop(signal.SIGKILL)
    assert before["counts"]["done"] < n, "killed while the job still ran"
    during = httpx.get(f"{app.url}/v1/jobs/{job_id}", timeout=10)
    assert during.status_code == 503 and during.json()["error"]["code"] == "unavailable", during.text
    for text in ("refund during the outage", "parcel during the outage"):
        started = time.monotonic()
        down = app.post("/v1/classify", {"input": text})
        assert down.status_code == 503 and down.json()["error"]["code"] == "not_ready", down.text
        assert time.monotonic() - started < 5
    time.sleep(OUTAGE_S)  # an outage that every loop of the app and the worker runs into

    redis_proc = DurableRedis(data, port, tmp_path / "redis-again.log")
    procs.append(redis_proc)

    def served() -> bool:
        return app.post("/v1/classify", {"input": "invoice after the restart"}).status_code == 200

    wait_for(served, 30, "interactive requests to be served again")
    wait_for(lambda: job(app.url, job_id)["status"] == "completed", 120, "the job to complete")
    status = job(app.url, job_id)
    assert status["counts"]["total"] == n and status["counts"]["done"] == n, status
    assert status["counts"]["failed"] == 0, status
    stored = httpx.get(
        f"{app.url}/v1/jobs/{job_id}/results?limit=100000",
        headers={"accept": "application/x-ndjson"},
        timeout=60,
    ).content.splitlines()
    results = [json.loads(line) for line in stored]
    assert [r["index"] for r in results] == list(range(n)), "every item once, in order"
    assert [r["custom_id"] for r in results] == [f"r{i}" for i in range(n)]
    assert all("response" in r for r in results)
    assert app.alive() and worker.alive(), "no process of ours was restarted"
    assert "unhandled_error" not in app.log(), "the outage was 503s, not 500s"
    assert app.post("/v1/classify", {"input": "charge"}).json()["results"][0]["label"] == "billing"


async def test_an_idempotency_key_whose_job_was_lost_makes_a_new_job(redis_proc: RedisProcess) -> None:
    # The key is written before the job's transaction, so a crash can keep the one and lose
    # the other: a retry with the same key must make the job rather than answer 404 forever.
    redis = make_pool(redis_proc.url)
    try:
        store = BulkStore(redis, ttl_s=60)
        await redis.set(keys.idempotency_key("m", "k"), "job_" + "0" * 32)
        made = [
            await store.create(
                deployment="m",
                surface="classify",
                requests=[b'{"input": "refund"}'],
                custom_ids=[""],
                errors={},
                idempotency_key="k",
            )
            for _ in range(2)
        ]
        (first, new), (again, new_again) = made
        assert new and first.status == "queued" and first.id != "job_" + "0" * 32
        assert not new_again and again.id == first.id
        assert await redis.zcard(keys.bulk_queue_name("m")) == 1, "its one chunk is queued"
    finally:
        await redis.aclose()


async def test_a_worker_outlives_a_redis_that_refuses_writes(
    redis_proc: RedisProcess, tmp_path: Path
) -> None:
    # A main Redis out of memory under noeviction refuses every write with an error that is not
    # a lost connection. The worker's loops (heartbeat, lease keeper, pollers) must go on and
    # serve again once it accepts writes; one that ended would leave the worker unseen by the
    # apps (no heartbeat) or its work lapsing (no lease renewal) for good.
    model, _ = load_model(
        load_plugins(),
        ModelOptions(ref=str(write_keywords(tmp_path / "kw")), engine="example_counts"),
        with_engine=True,
    )
    executor = ThreadPoolExecutor(max_workers=1)
    deployment = Deployment(model=model, limits=BatchLimits(batch_wait_ms=0), executor=executor)
    worker = DeviceWorker(
        redis_url=redis_proc.url, deployments=[deployment], stats=Stats([]), poll_delay_s=0.2
    )
    client = QueueClient(redis_proc.url)
    admin = make_pool(redis_proc.url)
    await worker.start()
    await client.start()
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")  # every write refused from now on
        before = await last_heartbeat(admin)
        await asyncio.sleep(OUTAGE_S)  # past a heartbeat and two lease renewals
        assert await last_heartbeat(admin) == before, "the heartbeats were refused"
        await admin.config_set("maxmemory", "0")
        deadline = time.monotonic() + HEARTBEAT_S + 10
        while await last_heartbeat(admin) == before:
            assert time.monotonic() < deadline, "no heartbeat once writes were accepted again"
            await asyncio.sleep(0.1)
        assert await client.workers.live("kw") == 1, "the heartbeat goes on"
        items = [item for item in _classify(model, "refund please")]
        answer = await client.submit("kw", model.info.model_sha256, items, timeout_s=10)
        assert answer.results[0] is not None and answer.misses == 1
    finally:
        await admin.config_set("maxmemory", "0")
        await client.close()
        await worker.close()
        await admin.aclose()
        executor.shutdown(wait=False)


async def last_heartbeat(redis: Any) -> float:
    """Until when the one worker of `kw` said it is live (its heartbeat's score)."""
    ((_, until),) = await redis.zrange(keys.worker_key("kw"), 0, -1, withscores=True)
    return float(until)


def _classify(model: object, text: str) -> list[object]:
    from vllm_srun.plugins.surfaces import ClassifyRequest
    from vllm_srun.queue.planning import plan_with_keys

    return list(plan_with_keys(model, "classify", ClassifyRequest(input=[text])).items)  # type: ignore[arg-type]

"""App replicas and a device worker around one Redis, each started as its own process."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from helpers import Proc, RedisProcess, Server, metric


def start_worker(tmp_path: Path, package: Path, redis_url: str, *extra: str) -> Proc:
    worker = Proc(
        [sys.executable, "-m", "vllm_srun.cli", "worker", str(package), "--redis", redis_url, *extra],
        tmp_path / f"worker-{time.monotonic_ns()}.log",
    )
    deadline = time.monotonic() + 60
    while "worker ready" not in worker.log():
        assert worker.alive(), worker.log()
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
    return worker


def wait_healthy(server: Server, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server.get("/health").status_code != 200:
        assert time.monotonic() < deadline, server.get("/health").text
        time.sleep(0.1)


def test_second_replica_answers_from_the_shared_cache(
    start_server: Callable[..., Server], keywords: Path, redis_proc: RedisProcess, tmp_path: Path
) -> None:
    first = start_server(str(keywords), "--redis", redis_proc.url)
    second = start_server(str(keywords), "--redis", redis_proc.url)
    worker = start_worker(tmp_path, keywords, redis_proc.url, "--metrics-port", "0")
    try:
        wait_healthy(first)
        body = {
            "input": ["Please refund the invoice", "Where is my parcel?"],
            "options": {"return_meta": True},
        }
        computed = first.post("/v1/classify", body).json()
        assert [r["label"] for r in computed["results"]] == ["billing", "shipping"]
        assert computed["meta"]["cache"] == {"hits": 0, "misses": 2}
        # The replica loads no engine: it reports what it was told, the worker ran it.
        assert computed["meta"]["engine"] == "auto"
        shared = second.post("/v1/classify", body).json()
        assert shared["meta"]["cache"] == {"hits": 2, "misses": 0}
        assert shared["results"] == computed["results"]
        assert metric(second.get("/metrics").text, "vllm_srun_cache_hits_total", model="keywords") == 2
    finally:
        worker.stop()


def test_replica_serves_again_after_redis_returns(
    start_server: Callable[..., Server], keywords: Path, redis_proc: RedisProcess, tmp_path: Path
) -> None:
    replica = start_server(str(keywords), "--redis", redis_proc.url)
    worker = start_worker(tmp_path, keywords, redis_proc.url)
    try:
        wait_healthy(replica)
        assert replica.post("/v1/classify", {"input": "refund"}).status_code == 200
        redis_proc.stop()
        down = replica.post("/v1/classify", {"input": "refund again"})
        assert down.status_code == 503 and down.json()["error"]["code"] == "unavailable"
        revived = RedisProcess(tmp_path / "redis-2.log", port=redis_proc.port)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    r = replica.post("/v1/classify", {"input": "refund once more"})
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 200:
                    break
                assert time.monotonic() < deadline, (r.text if r else "no answer", worker.log()[-2000:])
                time.sleep(0.3)
            assert r.json()["results"][0]["label"] == "billing"
            assert worker.alive()
        finally:
            revived.stop()
    finally:
        worker.stop()

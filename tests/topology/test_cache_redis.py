"""Two Redis roles: job state in a main Redis that does not evict, the result cache in its own.

Real redis-server processes, real `serve` and `worker` processes, real HTTP.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import redis
from helpers import (
    Proc,
    RedisProcess,
    Server,
    free_port,
    minilm_dir,
    run_cli,
    start_worker,
    wait_healthy,
    write_keywords,
)

from vllm_srun.cli.embedded_redis import find_redis_server
from vllm_srun.queue import keys
from vllm_srun.queue.redis import policy_of


def info(url: str, field: str) -> int:
    return int(redis.Redis.from_url(url).info("stats")[field])


def count_keys(url: str, pattern: str) -> int:
    return sum(1 for _ in redis.Redis.from_url(url).scan_iter(match=pattern, count=1000))


def test_bulk_job_overflowing_the_cache_redis_keeps_every_result(tmp_path: Path) -> None:
    main = RedisProcess(tmp_path / "main.log")  # no maxmemory: redis-server's noeviction
    cache = RedisProcess(tmp_path / "cache.log", maxmemory="2mb")  # allkeys-lru, as compose runs it
    package = str(minilm_dir())
    app = Server([package, "--redis", main.url, "--cache-redis", cache.url], tmp_path / "app.log")
    worker = start_worker(tmp_path, Path(package), main.url, "--cache-redis", cache.url)
    try:
        app.wait_ready()
        wait_healthy(app, timeout_s=60)
        # ~1.5 KiB of float32 per result: far past what 2 MiB of cache can keep.
        texts = [f"document {i} about the {i % 17}th topic of retrieval" for i in range(1500)]
        created = app.post("/v1/jobs", {"surface": "embeddings", "requests": [{"input": t} for t in texts]})
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        deadline = time.monotonic() + 240
        while (status := app.get(f"/v1/jobs/{job_id}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
        assert status["status"] == "completed", status
        data = app.get(f"/v1/jobs/{job_id}/results?limit=100000").json()["data"]
        assert len(data) == len(texts)
        assert all(len(line["response"]["data"][0]["embedding"]) == 384 for line in data)
        # The cache overflowed and evicted; the main Redis evicted nothing and holds no cache entry.
        assert info(cache.url, "evicted_keys") > 0
        assert info(main.url, "evicted_keys") == 0
        assert count_keys(main.url, keys.result_key("*", "*")) == 0
        assert count_keys(cache.url, keys.job_key("*")) == 0
        # An interactive request for an evicted input is computed again, the same numbers.
        first = app.post("/v1/embeddings", {"input": texts[0]}).json()["data"][0]["embedding"]
        # Alone now, in a bulk batch before: a row run alone and in a batch agree within 1e-5
        # (the engines' parity bound, tests/engines/conftest.py), and normalising to unit length
        # only shrinks that for a pooled vector longer than 1.
        assert first == pytest.approx(data[0]["response"]["data"][0]["embedding"], abs=1e-5)
    finally:
        app.stop()
        worker.stop()
        main.stop()
        cache.stop()


def test_an_evicting_main_redis_is_reported_in_health(tmp_path: Path) -> None:
    main = RedisProcess(tmp_path / "main.log", maxmemory="64mb")  # allkeys-lru
    package = write_keywords(tmp_path / "kw")
    app = Server([str(package), "--redis", main.url], tmp_path / "app.log")
    worker = None
    try:
        app.wait_ready()
        body = app.get("/health").json()  # 503 until a worker serves it: the detail is there anyway
        assert body["redis"]["maxmemory_policy"] == "allkeys-lru"
        assert body["redis"]["evicting"] is True
        assert "noeviction" in body["redis"]["warning"]
        assert "redis_evicts" in app.log()
        worker = start_worker(tmp_path, package, main.url)
        assert "redis_evicts" in worker.log()
        wait_healthy(app)  # it serves all the same: a warning, not a refusal
        assert app.get("/health").json()["redis"]["evicting"] is True
    finally:
        app.stop()
        if worker is not None:
            worker.stop()
        main.stop()


def test_strict_redis_refuses_an_evicting_main_redis(tmp_path: Path) -> None:
    main = RedisProcess(tmp_path / "main.log", maxmemory="64mb")
    package = str(write_keywords(tmp_path / "kw"))
    try:
        for command in (["serve", package, "--port", "1"], ["worker", package]):
            done = run_cli(*command, "--redis", main.url, "--strict-redis", timeout=120)
            assert done.returncode == 2, done.stderr
            assert "--strict-redis" in done.stderr and "allkeys-lru" in done.stderr
    finally:
        main.stop()


def test_a_redis_without_config_is_unknown_and_serves(tmp_path: Path) -> None:
    """Managed Redis services often rename CONFIG: the start says `unknown` and goes on."""
    port = free_port()
    proc = Proc(
        [
            find_redis_server(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--rename-command",
            "CONFIG",
            "",
        ],
        tmp_path / "main.log",
    )
    url = f"redis://127.0.0.1:{port}/0"
    package = write_keywords(tmp_path / "kw")
    app = None
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, proc.log()
                time.sleep(0.05)
        app = Server([str(package), "--redis", url, "--strict-redis"], tmp_path / "app.log").wait_ready()
        assert "redis" not in httpx.get(app.url + "/health", timeout=10).json()
    finally:
        if app is not None:
            app.stop()
        proc.stop()


@pytest.mark.parametrize(
    ("reply", "policy", "evicting"),
    [
        ({"maxmemory-policy": "noeviction"}, "noeviction", False),
        ({b"maxmemory-policy": b"allkeys-lru"}, "allkeys-lru", True),
        ([b"maxmemory-policy", b"volatile-ttl"], "volatile-ttl", True),
        ({}, "unknown", False),
    ],
)
def test_policy_of_a_config_get_reply(reply: object, policy: str, evicting: bool) -> None:
    read = policy_of(reply)
    assert (read.maxmemory_policy, read.evicting) == (policy, evicting)
    assert (read.warning is not None) == evicting

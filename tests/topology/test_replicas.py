"""App replicas and a device worker around one Redis, each started as its own process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis
from helpers import RedisProcess, Server, metric, start_worker, wait_healthy


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
        # Each replica keeps what it answered: with the Redis entries gone, both still hit.
        client = redis.Redis.from_url(redis_proc.url)
        assert client.delete(*client.keys("vllm_srun:result:*")) == 2
        for replica in (first, second):
            again = replica.post("/v1/classify", body).json()
            assert again["meta"]["cache"] == {"hits": 2, "misses": 0}
            assert again["results"] == computed["results"]
    finally:
        worker.stop()

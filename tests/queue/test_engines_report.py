"""What a deployment's engines run, as the app learns it from the live workers: each worker
writes its engine model's `describe()` with its heartbeat, and the client merges the live ones."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from arq.connections import ArqRedis

from vllm_srun.plugins.stats import Stats
from vllm_srun.queue import keys
from vllm_srun.queue.client import QueueClient
from vllm_srun.queue.worker.device_worker import Deployment, DeviceWorker


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[QueueClient]:
    client = QueueClient(redis_url, result_ttl_s=60)
    await client.start()
    yield client
    await client.close()


class _Described:
    """The keyword model's engine model, saying what a native one says of itself."""

    def __init__(self, inner: Any, said: dict[str, Any]) -> None:
        self.inner, self.said = inner, said

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def describe(self) -> dict[str, Any]:
        return self.said


async def test_the_live_workers_say_which_paths_a_deployment_runs(
    redis_url: str,
    redis: ArqRedis,
    client: QueueClient,
    deployment: Deployment,
    stats: Stats,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = deployment.name
    said = {
        "engine_paths": ["native", "onnxruntime-small-batch"],
        "memory_bytes": {"native": 0, "onnxruntime-small-batch": 7},
    }
    monkeypatch.setattr(deployment.model, "engine_model", _Described(deployment.model.engine_model, said))
    assert await client.workers.engines(name) == {}
    # A worker that died without withdrawing: its heartbeat lapsed, so what it said is ignored.
    await redis.zadd(keys.worker_key(name), {"ghost": int(time.time() * 1000) - 1})
    await redis.hset(keys.engines_key(name), "ghost", json.dumps({"engine_paths": ["ghost-path"]}))
    worker = DeviceWorker(redis_url=redis_url, deployments=[deployment], stats=stats)
    await worker.start()
    try:
        assert await client.workers.engines(name) == said
        # The live worker's heartbeat dropped the dead one from both: nothing of it is left.
        assert await redis.zscore(keys.worker_key(name), "ghost") is None
        assert await redis.hget(keys.engines_key(name), "ghost") is None  # type: ignore[misc]
        # A second live worker with a plain engine: the union of the paths, the most memory per path.
        await redis.zadd(keys.worker_key(name), {"other": int(time.time() * 1000) + 60_000})
        await redis.hset(
            keys.engines_key(name),
            "other",
            json.dumps({"engine_paths": ["native", "native-small-batch"], "memory_bytes": {"native": 3}}),
        )
        merged = await client.workers.engines(name)
        assert merged["engine_paths"] == ["native", "onnxruntime-small-batch", "native-small-batch"]
        assert merged["memory_bytes"] == {"native": 3, "onnxruntime-small-batch": 7}
        await redis.zrem(keys.worker_key(name), "other")
    finally:
        await worker.close()
    assert await redis.hget(keys.engines_key(name), worker.worker_id) is None
    assert await client.workers.engines(name) == {}

"""/v1/models and `meta` say which forward paths a deployment's engine chooses between, and
what memory each adds: learned from the worker (through Redis), so a replica whose workers are
other processes reports them as the embedded server does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Proc, RedisProcess, Server, start_worker, wait_healthy

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from vllm_srun.testing.task_heads_fixtures import write_fixture

PATHS = ["native", "onnxruntime-small-batch"]


def check(server: Server) -> None:
    (card,) = server.get("/v1/models").json()["data"]
    assert card["engine"] == "native"  # upstream's field stays the engine named at start
    assert card["engine_paths"] == PATHS
    assert set(card["memory_bytes"]) == set(PATHS)
    assert card["memory_bytes"]["native"] == 0 and card["memory_bytes"]["onnxruntime-small-batch"] > 0
    assert server.get(f"/v1/models/{card['id']}").json()["engine_paths"] == PATHS
    body = {"model": card["id"], "input": "the city is very good", "options": {"return_meta": True}}
    meta = server.post("/v1/embeddings", body).json()["meta"]
    assert meta["engine"] == "native" and meta["engine_paths"] == PATHS


def test_the_embedded_server_reports_its_engine_paths(
    module_server: Callable[..., Server], tmp_path: Path
) -> None:
    package = write_fixture(tmp_path / "emb", variant="bert-embedding")
    check(module_server(str(package), "--engine", "native"))


def test_a_replica_reports_the_paths_of_its_separate_workers(tmp_path: Path, procs: list[Proc]) -> None:
    package = write_fixture(tmp_path / "emb", variant="bert-embedding")
    redis = RedisProcess(tmp_path / "redis.log")
    procs.append(redis)
    worker = start_worker(tmp_path, package, redis.url, "--engine", "native")
    procs.append(worker)
    server = Server([str(package), "--redis", redis.url, "--engine", "native"], tmp_path / "app.log")
    procs.append(server)
    server.wait_ready()
    wait_healthy(server)
    check(server)
    worker.stop()
    server_models = server.get("/v1/models").json()["data"][0]
    assert "engine_paths" not in server_models  # no live worker: nothing to report

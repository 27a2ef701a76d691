"""Quantized embeddings on app replicas, which hold no weights: the calibration corpus reaches the
worker through the queue like any request, and two replicas quantize alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import RedisProcess, Server, start_worker, wait_healthy

TEXTS = ["where do foxes live", "invoices are due at the end of the month", "a"]


def test_replicas_quantize_on_the_same_calibration(
    start_server: Callable[..., Server], redis_proc: RedisProcess, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    reference = pytest.importorskip("sentence_transformers.util.quantization").quantize_embeddings
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    package = write_fixture(tmp_path / "embed", variant="bert-embedding")
    first = start_server(str(package), "--redis", redis_proc.url, ready=False).wait_ready()
    second = start_server(str(package), "--redis", redis_proc.url, ready=False).wait_ready()
    worker = start_worker(tmp_path, package, redis_proc.url, "--metrics-port", "0")
    try:
        wait_healthy(first)
        wait_healthy(second)
        answers = []
        for replica in (first, second):
            body = {"input": TEXTS, "options": {"embedding_type": "int8"}}
            response = replica.post("/v1/embeddings", body)
            assert response.status_code == 200, response.text
            answers.append(np.asarray([item["embedding"] for item in response.json()["data"]]))
        assert np.array_equal(answers[0], answers[1])
        floats = [item["embedding"] for item in first.post("/v1/embeddings", {"input": TEXTS}).json()["data"]]
        (card,) = second.get("/v1/models").json()["data"]
        ranges = np.asarray(card["quantization"]["calibration"]["ranges"], dtype=np.float32)
        expected = reference(np.asarray(floats, dtype=np.float32), precision="int8", ranges=ranges)
        assert np.array_equal(answers[1], expected)
    finally:
        worker.stop()

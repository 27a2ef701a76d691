"""Concurrent requests share one forward: seen in the batch-size metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
from helpers import Server, metric, write_keywords


def test_concurrent_requests_share_a_forward(start_server: Callable[..., Server], tmp_path: Path) -> None:
    package = write_keywords(tmp_path / "kw", "batching")
    server = start_server(str(package), "--batch-wait-ms", "300", "--served-model-name", "kw")
    texts = ["refund " * (i + 1) for i in range(8)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/classify", json={"input": t}) for t in texts))

    responses = asyncio.run(burst())
    assert all(r.status_code == 200 and r.json()["results"][0]["label"] == "billing" for r in responses)
    text = server.get("/metrics").text
    forwards = metric(text, "vllm_srun_batch_size_count", model="kw")
    rows = metric(text, "vllm_srun_batch_size_sum", model="kw")
    assert rows == 8
    assert forwards < 8, f"{forwards} forwards for 8 concurrent requests"

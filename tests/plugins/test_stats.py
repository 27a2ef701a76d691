"""A stat logger that raises cannot hurt serving: every request is answered, /metrics renders."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from helpers import Server, fake_distribution, metric

from vllm_srun.plugins.stats import StatLoggerBase, Stats

# Sorted before `prometheus`, so its render is asked first; every method raises.
BROKEN = """
from vllm_srun.plugins.stats import StatLoggerBase

class Broken(StatLoggerBase):
    def record_request(self, **kw): raise RuntimeError("sink down: request")
    def record_cache(self, **kw): raise RuntimeError("sink down: cache")
    def record_batch(self, **kw): raise RuntimeError("sink down: batch")
    def record_queue_depth(self, **kw): raise RuntimeError("sink down: depth")
    def render(self): raise RuntimeError("sink down: render")
"""


class Raising(StatLoggerBase):
    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        raise ValueError(f"cannot record {size} rows")

    def render(self) -> tuple[bytes, str] | None:
        raise ValueError("cannot render")


class Keeping(StatLoggerBase):
    def __init__(self) -> None:
        self.batches: list[int] = []

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        self.batches.append(size)

    def render(self) -> tuple[bytes, str] | None:
        return b"kept\n", "text/plain"


def test_a_raising_sink_is_skipped_and_logged_once_per_method(capsys: Any) -> None:
    keeping = Keeping()
    stats = Stats([Raising(), keeping])
    for size in (1, 2, 3):
        stats.record_batch(model="m", size=size, tokens=size, forward_s=0.0, queue_s=0.0)
    assert keeping.batches == [1, 2, 3]
    assert stats.render() == (b"kept\n", "text/plain")
    assert stats.render() == (b"kept\n", "text/plain")
    logged = capsys.readouterr()
    text = logged.out + logged.err
    assert text.count("stat_logger_failed") == 2, text  # record_batch once, render once
    assert "cannot record 1 rows" in text and "cannot render" in text
    assert "cannot record 2 rows" not in text


def test_a_raising_stat_logger_plugin_leaves_every_request_answered(
    start_server: Callable[..., Server], keywords: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    fake_distribution(
        site, "acme-broken-sink", {"vllm_srun.stat_loggers": {"a_broken": "acme_broken_sink:Broken"}}, BROKEN
    )
    server = start_server(
        str(keywords), "--served-model-name", "kw", "--request-timeout-s", "10", env={"PYTHONPATH": str(site)}
    )

    texts = [f"please refund invoice {i}" for i in range(12)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=20.0) as client:
            classify = [client.post("/v1/classify", json={"model": "kw", "input": t}) for t in texts]
            embed = [client.post("/v1/embeddings", json={"model": "kw", "input": t}) for t in texts]
            return await asyncio.gather(*classify, *embed)

    for _ in range(2):  # the second round runs after the sink has failed once already
        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * len(responses), [r.text for r in responses]
    assert responses[0].json()["results"][0]["label"] == "billing"

    page = server.get("/metrics")
    assert page.status_code == 200
    assert metric(page.text, "vllm_srun_requests_total", model="kw", surface="classify", status="200") == 24
    log = server.log()
    assert "stat_logger_failed" in log and "sink down: batch" in log and "sink down: render" in log

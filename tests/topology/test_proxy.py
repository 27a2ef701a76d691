"""compose.yaml's topology as processes: proxy + two app replicas + a worker + state and cache Redis.

The default model of the image (all-MiniLM-L6-v2), one published port (the proxy), a state
Redis that does not evict and a cache Redis that does.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import Proc, RedisProcess, Server, minilm_dir, start_worker, wait_healthy


@dataclass
class Stack:
    proxy_url: str
    apps: list[Server]
    procs: list[Proc]


def wait_ok(url: str, proc: Proc, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.alive(), proc.log()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.1)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    state = RedisProcess(tmp_path / "state.log")  # noeviction, as compose runs it
    cache = RedisProcess(tmp_path / "cache.log", maxmemory="64mb")  # allkeys-lru
    package = str(minilm_dir())
    roles = ["--redis", state.url, "--cache-redis", cache.url]
    apps = [Server([package, *roles, "--strict-redis"], tmp_path / f"app-{i}.log") for i in range(2)]
    procs: list[Proc] = [state, cache, *apps]
    try:
        procs.append(start_worker(tmp_path, Path(package), state.url, "--cache-redis", cache.url))
        proxy_args = [sys.executable, "-m", "vllm_srun.cli", "proxy", "--listen", "127.0.0.1:0"]
        proxy_args += ["--upstream", *(app.url for app in apps)]
        procs.append(Proc(proxy_args, tmp_path / "proxy.log"))
        for app in apps:
            app.wait_ready()
            wait_healthy(app, timeout_s=60)
        proxy_url = f"http://127.0.0.1:{procs[-1].listening_port()}"
        wait_ok(proxy_url + "/health", procs[-1])
        yield Stack(proxy_url, apps, procs)
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_embeddings_through_the_proxy_are_the_replicas(stack: Stack) -> None:
    texts = ["the proxy forwards this", "and this one too"]
    through = httpx.post(stack.proxy_url + "/v1/embeddings", json={"input": texts}, timeout=60)
    assert through.status_code == 200, through.text
    direct = httpx.post(stack.apps[1].url + "/v1/embeddings", json={"input": texts}, timeout=60).json()
    got = [d["embedding"] for d in through.json()["data"]]
    assert len(got) == 2 and len(got[0]) == 384
    # The same two texts in the same batch (or the shared cache's copy): the same float32, which
    # JSON carries exactly; the float32 spacing of the components is the margin.
    for mine, theirs in zip(got, (d["embedding"] for d in direct["data"]), strict=True):
        assert mine == pytest.approx(theirs, abs=1e-6)


def test_a_job_event_stream_through_the_proxy_is_unbuffered(stack: Stack) -> None:
    lines = [{"input": f"request {i}: a sentence about topic {i % 31} and retrieval"} for i in range(1536)]
    body = "\n".join(json.dumps(line) for line in lines)
    created = httpx.post(
        stack.proxy_url + "/v1/jobs?surface=embeddings",
        content=body,
        headers={"content-type": "application/x-ndjson"},
        timeout=60,
    )
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    first_seen_status = None
    results = 0
    final = None
    with httpx.stream("GET", f"{stack.proxy_url}/v1/jobs/{job_id}/events", timeout=120) as stream:
        event = None
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "result":
                results += 1
                if first_seen_status is None:  # asked of a replica directly, not through the proxy
                    first_seen_status = httpx.get(f"{stack.apps[0].url}/v1/jobs/{job_id}", timeout=10).json()
            elif line.startswith("data:") and event == "status":
                final = json.loads(line[5:].strip())["status"]
                if final in ("completed", "failed", "cancelled"):
                    break
    assert final == "completed"
    assert results == len(lines)
    # The first event arrived while the job still ran: nothing held it back until the end.
    assert first_seen_status is not None and first_seen_status["status"] != "completed", first_seen_status

"""Issue 22, H3 under load: a state Redis filled by a client's jobs refuses with 503, never dies.

The state Redis runs as compose and Kubernetes run it (`noeviction` under a `maxmemory`), scaled
down to a few MiB so a test fills it in seconds: real redis-server, real `serve` replica and
`worker` processes, real HTTP on 127.0.0.1. Before the fence the manifests set no `maxmemory`, so
the kernel killed Redis, and every queue in it, at the pod's limit.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import redis
from helpers import RedisProcess, Server, start_worker, wait_healthy, write_keywords

MAXMEMORY_MB = 8
LINES = 400  # one job: 400 requests of ~600 bytes, about 0.5 MiB of state before results


def jsonl(job: int) -> bytes:
    words = ("refund", "invoice", "charge", "parcel", "delivery")
    lines = [
        json.dumps({"input": " ".join(words[(job + i + k) % 5] for k in range(100))}) for i in range(LINES)
    ]
    return ("\n".join(lines) + "\n").encode()


def test_a_full_state_redis_answers_503_and_stays_up(tmp_path: Path) -> None:
    state = RedisProcess(tmp_path / "state.log", maxmemory=f"{MAXMEMORY_MB}mb", policy="noeviction")
    package = write_keywords(tmp_path / "kw")
    # Quotas far above what fits, so the Redis's own bound is what is reached.
    app = Server([str(package), "--redis", state.url, "--served-model-name", "kw"], tmp_path / "app.log")
    worker = start_worker(tmp_path, package, state.url)
    admin = redis.Redis.from_url(state.url)
    try:
        app.wait_ready()
        wait_healthy(app)
        accepted: list[str] = []
        refused = None
        live_s = 0.0
        for job in range(200):
            r = httpx.post(
                f"{app.url}/v1/jobs?surface=embeddings",
                content=jsonl(job),
                headers={"content-type": "application/x-ndjson"},
                timeout=30,
            )
            started = time.monotonic()
            assert httpx.get(f"{app.url}/health/live", timeout=5).status_code == 200
            live_s = max(live_s, time.monotonic() - started)
            if r.status_code != 202:
                refused = r
                break
            accepted.append(r.json()["id"])
        assert refused is not None, f"{len(accepted)} jobs fit in {MAXMEMORY_MB} MiB"
        # The refusal is the documented one: 503, Retry-After, the reason named.
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"]
        assert "state Redis is full" in refused.json()["error"]["message"]
        assert len(refused.content) < 1000  # Redis's message (it quotes the job's requests) stays out
        assert accepted, "at least one job fits before the Redis is full"
        # Redis is alive, within its bound, and evicted nothing (no queue or job lost).
        assert admin.ping()
        memory = admin.info("memory")
        assert memory["used_memory"] <= (MAXMEMORY_MB + 2) * 2**20, memory["used_memory_human"]
        assert admin.info("stats")["evicted_keys"] == 0
        # The replica stayed responsive throughout and answers plain requests that need no write.
        assert live_s < 1.0, live_s
        assert app.get("/v1/models").status_code == 200
        # An interactive request that must queue work is answered (its few small writes may
        # still fit once the refused job's buffered commands are freed) or refused as above;
        # never a 500.
        fresh = httpx.post(f"{app.url}/v1/embeddings", json={"input": "refund " * 7 + "parcel"}, timeout=30)
        assert fresh.status_code in (200, 503), fresh.text
        if fresh.status_code == 503:
            assert fresh.headers["retry-after"] and len(fresh.content) < 1000, fresh.text
        # Every accepted job is whole: its state reads back with all its requests counted.
        for job_id in accepted:
            status = app.get(f"/v1/jobs/{job_id}")
            assert status.status_code == 200 and status.json()["counts"]["total"] == LINES, status.text
        # Given room again (an operator raising maxmemory, or jobs expiring), jobs are admitted.
        admin.config_set("maxmemory", "0")
        again = httpx.post(
            f"{app.url}/v1/jobs?surface=embeddings",
            content=jsonl(0),
            headers={"content-type": "application/x-ndjson"},
            timeout=30,
        )
        assert again.status_code == 202, again.text
    finally:
        admin.close()
        app.stop()
        worker.stop()
        state.stop()

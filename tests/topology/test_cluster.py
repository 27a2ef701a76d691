"""State and cache on a real Redis Cluster: 3 masters and 3 replicas of the bundled redis-server.

Two app replicas and a worker, each given a different node's URL, serve interactive requests
and a 5,000-line job; a second replica answers from the shared cache; every master holds keys;
no process ever meets a CROSSSLOT error. A cluster with unassigned slots, and a node that
refuses CLUSTER commands, refuse the start naming the URL.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from helpers import (
    REPO,
    RedisCluster,
    RedisProcess,
    Server,
    assert_no_crossslot,
    cluster_node,
    keyword_text,
    start_worker,
    submit_job,
    wait_healthy,
    write_keywords,
)

from vllm_srun.queue import keys

RESULTS = keys.PREFIX + ":result:*"
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    made = RedisCluster(tmp_path_factory.mktemp("cluster"))
    yield made
    made.stop()


def node_url(cluster: RedisCluster, index: int) -> str:
    return cluster.nodes[index].url


def test_interactive_requests_and_a_job_on_a_cluster(cluster: RedisCluster, tmp_path: Path) -> None:
    package = write_keywords(tmp_path / "kw")
    # Each process is given another node: any node's URL finds the whole cluster.
    apps = [
        Server([str(package), "--redis", node_url(cluster, i)], tmp_path / f"app-{i}.log") for i in (0, 4)
    ]
    worker = start_worker(tmp_path, package, node_url(cluster, 2))
    try:
        for app in apps:
            app.wait_ready()
            wait_healthy(app)
        inputs = [keyword_text(i) for i in range(40)]
        body = {"input": inputs, "options": {"return_meta": True}}
        computed = apps[0].post("/v1/classify", body).json()
        assert computed["meta"]["cache"] == {"hits": 0, "misses": 40}
        assert len(computed["results"]) == 40
        shared = apps[1].post("/v1/classify", body).json()
        assert shared["meta"]["cache"] == {"hits": 40, "misses": 0}  # from the cache, on other masters
        assert shared["results"] == computed["results"]
        for i in range(20):  # one request at a time, on both replicas
            one = apps[i % 2].post("/v1/classify", {"input": [keyword_text(1000 + i)]})
            assert one.status_code == 200, one.text

        started = time.monotonic()
        lines = [{"input": keyword_text(10_000 + i), "custom_id": str(i)} for i in range(5000)]
        job_id = submit_job(apps[1].url, lines)
        deadline = time.monotonic() + 120
        while (status := apps[0].get(f"/v1/jobs/{job_id}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        assert status["status"] == "completed", status
        assert status["counts"]["done"] == 5000 and status["counts"]["failed"] == 0, status
        results = apps[0].get(f"/v1/jobs/{job_id}/results?limit=100000").json()["data"]
        assert sorted(int(line["custom_id"]) for line in results) == list(range(5000))
        assert all(line.get("error") is None for line in results)
        print(f"5000-line job on the cluster: {time.monotonic() - started:.1f} s")

        # Cache entries spread over every master; the model's queue keys and the job's in their
        # own slots, wherever those are.
        waits = 0
        for master in cluster.masters():
            client = redis.Redis(port=master.port)
            assert any(client.scan_iter(match=RESULTS, count=1000)), master.port
            waits += int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
            client.close()
        # The writes other slots depend on waited for a replica (chunks, the job, the enqueues).
        assert waits >= 5000 // 256, waits
        assert apps[0].get("/health").status_code == 200
        for app in apps:
            assert "unhandled_error" not in app.log(), app.log()[-4000:]
        assert_no_crossslot(*(app.log() for app in apps), worker.log(), cluster.logs())
    finally:
        for app in apps:
            app.stop()
        worker.stop()


def start_refused(package: Path, url: str, tmp_path: Path) -> str:
    """What `vllm-srun worker` says when it refuses to start on `url` (it must, within 30 s)."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_srun.cli", "worker", str(package), "--redis", url],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_cluster_with_unassigned_slots_refuses_the_start(tmp_path: Path) -> None:
    node = cluster_node(tmp_path)  # never joined to a cluster: no slot assigned
    try:
        said = start_refused(write_keywords(tmp_path / "kw"), node.url, tmp_path)
        assert f"127.0.0.1:{node.port}" in said and "0 of 16384 slots assigned" in said, said
    finally:
        node.stop()


def test_a_node_refusing_cluster_commands_refuses_the_start(tmp_path: Path) -> None:
    node = cluster_node(tmp_path, extra=["--rename-command", "CLUSTER", '""'])
    try:
        said = start_refused(write_keywords(tmp_path / "kw"), node.url, tmp_path)
        assert f"127.0.0.1:{node.port}" in said and "refuses CLUSTER commands" in said, said
    finally:
        node.stop()


def test_a_cluster_cache_redis_beside_a_single_state_redis(cluster: RedisCluster, tmp_path: Path) -> None:
    """The cache Redis may be a cluster of its own while the state Redis is one server."""
    package = write_keywords(tmp_path / "kw")
    state = RedisProcess(tmp_path / "state.log")
    app = Server([str(package), "--redis", state.url, "--cache-redis", cluster.url], tmp_path / "app.log")
    worker = start_worker(tmp_path, package, state.url, "--cache-redis", node_url(cluster, 1))
    try:
        app.wait_ready()
        wait_healthy(app)
        body = {"input": [keyword_text(50_000 + i) for i in range(30)], "options": {"return_meta": True}}
        assert app.post("/v1/classify", body).json()["meta"]["cache"]["misses"] == 30
        assert app.post("/v1/classify", {**body, "input": body["input"][::-1]}).status_code == 200
        state_client = redis.Redis.from_url(state.url)
        assert not any(state_client.scan_iter(match=RESULTS))
        stored = sum(
            sum(1 for _ in redis.Redis(port=m.port).scan_iter(match=RESULTS)) for m in cluster.masters()
        )
        assert stored >= 30
        assert_no_crossslot(app.log(), worker.log())
        assert httpx.get(app.url + "/health").status_code == 200
    finally:
        app.stop()
        worker.stop()
        state.stop()

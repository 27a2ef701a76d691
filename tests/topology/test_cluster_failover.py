"""A master of the state's Redis Cluster SIGKILLed mid-job: its replica is promoted, and nothing
is lost or counted twice.

A real cluster of 3 masters and 3 replicas (cluster-node-timeout 1 s), two app replicas and two
workers, each given another node. A 10,000-line job runs while interactive clients send
requests; once the job has stored some lines, the master that holds the bulk state's slot is
killed (or, in the second case, the master of the model's queues and leases; in the third, the
node, master or replica, on which an app listens for its replies). The job completes with every line exactly once; every interactive request is answered
(a 503 or a lost connection retried, as a client of a replicated service does, within its own
deadline); no process answered 500 or met a CROSSSLOT error.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from helpers import (
    RedisCluster,
    Server,
    assert_no_crossslot,
    keyword_text,
    start_worker,
    submit_job,
    wait_healthy,
    write_keywords,
)
from redis.cluster import RedisCluster as SyncCluster

from vllm_srun.queue import keys

JOB_LINES = 10_000
REQUEST_DEADLINE_S = 30.0


class Clients(threading.Thread):
    """Sends small classify requests to the replicas in turn until stopped; each is retried on
    503 or a failed connection until its deadline. Counts what each request ended as."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.stopping = threading.Event()
        self.answered = 0
        self.retried = 0
        self.failed: list[str] = []

    def run(self) -> None:
        i = 0
        with httpx.Client(timeout=10) as http:
            while not self.stopping.is_set():
                inputs = [keyword_text(200_000 + 2 * i), keyword_text(200_001 + 2 * i)]
                self.one(http, i, inputs)
                i += 1

    def one(self, http: httpx.Client, i: int, inputs: list[str]) -> None:
        deadline = time.monotonic() + REQUEST_DEADLINE_S
        attempt = 0
        while time.monotonic() < deadline:
            url = self.urls[(i + attempt) % len(self.urls)]
            attempt += 1
            try:
                r = http.post(url + "/v1/classify", json={"input": inputs})
            except httpx.HTTPError:
                self.retried += 1
                continue
            if r.status_code == 503:
                self.retried += 1
                time.sleep(0.05)
                continue
            if r.status_code == 200 and len(r.json()["results"]) == 2:
                self.answered += 1
            else:
                self.failed.append(f"{r.status_code} {r.text[:300]}")
            return
        self.failed.append(f"request {i}: no answer in {REQUEST_DEADLINE_S} s")


def master_of(cluster: RedisCluster, key: str) -> int:
    """The port of the master serving `key`'s slot now."""
    client = SyncCluster(host="127.0.0.1", port=cluster.masters()[0].port)
    try:
        return int(client.get_node_from_key(key).port)
    finally:
        client.close()


def reply_listeners(cluster: RedisCluster) -> dict[bytes, tuple[bool, int]]:
    """Each app's reply channel: (whether a replica, port) of the node it is subscribed on (a
    subscription is the one node's: `PUBSUB CHANNELS` lists only its own)."""
    found = {}
    for node in (n for n in cluster.nodes if n.alive()):
        client = redis.Redis(port=node.port, socket_timeout=2)
        try:
            replica = client.info("replication")["role"] != "master"
            found.update({channel: (replica, node.port) for channel in client.pubsub_channels(keys.reply_channel("*"))})
        finally:
            client.close()
    return found


@pytest.mark.parametrize("victim_of", ["bulk state", "model queue", "reply subscription"])
def test_a_master_killed_mid_job_loses_nothing(tmp_path: Path, victim_of: str) -> None:
    started = time.monotonic()
    cluster = RedisCluster(tmp_path / "cluster", node_timeout_ms=1000)
    package = write_keywords(tmp_path / "kw")
    apps = [Server([str(package), "--redis", cluster.nodes[i].url], tmp_path / f"app-{i}.log") for i in (0, 3)]
    workers = [start_worker(tmp_path, package, cluster.nodes[i].url) for i in (1, 4)]
    clients = Clients([app.url for app in apps])
    try:
        for app in apps:
            app.wait_ready()
            wait_healthy(app)
        clients.start()
        lines = [{"input": keyword_text(i), "custom_id": str(i)} for i in range(JOB_LINES)]
        job_id = submit_job(apps[0].url, lines)
        # The master of the job's records and the quotas, or of the model's queues and leases.
        victim_key = keys.job_key(job_id) if victim_of == "bulk state" else keys.queue_name("kw")
        if victim_of == "reply subscription":
            listeners = reply_listeners(cluster)
            assert len(listeners) == len(apps), listeners
            victim_port = min(listeners.values())[1]  # a master where an app listens on one
            victim_key = ""
            for slot_key in (keys.job_key(job_id), keys.queue_name("kw")):
                if master_of(cluster, slot_key) == victim_port:
                    victim_key = slot_key  # wait below for its replica's promotion
        else:
            victim_port = master_of(cluster, victim_key)
        victim = next(node for node in cluster.nodes if node.port == victim_port)
        deadline = time.monotonic() + 60
        while (done := apps[0].get(f"/v1/jobs/{job_id}").json()["counts"]["done"]) < 500:
            assert time.monotonic() < deadline, "the job stored nothing"
            time.sleep(0.02)
        assert done < JOB_LINES, "the job ended before the kill: make it longer"
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()

        # Its replica takes over its slots.
        deadline = time.monotonic() + 30
        while victim_key and victim_port == master_of_alive(cluster, victim_key):
            assert time.monotonic() < deadline, "no replica was promoted"
            time.sleep(0.1)

        deadline = time.monotonic() + 90
        while True:
            try:
                status = apps[1].get(f"/v1/jobs/{job_id}").json()
            except httpx.HTTPError:
                status = {"status": "unreachable"}
            if status.get("status") in ("completed", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        clients.stopping.set()
        clients.join(REQUEST_DEADLINE_S + 5)
        assert status["status"] == "completed", status
        assert status["counts"]["done"] == JOB_LINES and status["counts"]["failed"] == 0, status
        results = apps[0].get(f"/v1/jobs/{job_id}/results?limit=100000").json()["data"]
        indices = [int(line["custom_id"]) for line in results]
        assert sorted(indices) == list(range(JOB_LINES)), "a line lost or stored twice"
        assert not clients.failed, clients.failed[:5]
        assert clients.answered > 0
        for app in apps:
            assert "unhandled_error" not in app.log(), app.log()[-4000:]
        assert_no_crossslot(*(app.log() for app in apps), *(w.log() for w in workers))
        if victim_of == "reply subscription":  # an app lost its subscription, and took another
            assert any("reply_channel_lost" in app.log() for app in apps)
            now = reply_listeners(cluster)
            assert now.keys() == listeners.keys() and victim_port not in {p for _, p in now.values()}, now
        print(
            f"failover: {clients.answered} interactive requests answered, {clients.retried} retries; "
            f"{time.monotonic() - started:.1f} s"
        )
    finally:
        clients.stopping.set()
        for proc in [*apps, *workers]:
            proc.stop()
        cluster.stop()
    assert time.monotonic() - started < 150


def master_of_alive(cluster: RedisCluster, key: str) -> int:
    """`master_of`, asked of a node still alive (the killed one's view is gone)."""
    for node in cluster.nodes:
        if not node.alive():
            continue
        client = redis.Redis(port=node.port, socket_timeout=2)
        try:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        except redis.RedisError:
            continue
        finally:
            client.close()
    raise AssertionError("no node answers")

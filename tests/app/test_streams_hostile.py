"""Event streams that cannot starve the replica (issue 22 part 2, H2): real sockets on 127.0.0.1
against a replica on a real Redis with a worker, every test bounded in seconds.

The streamed jobs are planted in Redis as a worker leaves a job mid-run (status running, results
stored), so a stream stays open for as long as the test holds it."""

from __future__ import annotations

import array
import fcntl
import socket
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from helpers import Proc, RedisProcess, Server, start_worker, write_keywords

from vllm_srun.queue import keys

MAX_STREAMS = 110
STREAM_CONNECTIONS = 8
# 100 readers that never read, each stream holding at most one batch (--event-batch-bytes,
# 256 KiB by default) and the transport's buffer: well under this. Before, a stream held a
# 500-event batch (here 500 x 8 KiB = 4 MiB each, 400 MiB for 100).
RSS_GROWTH_BOUND_MIB = 100
LINE_BYTES = 8 * 1024


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, RedisProcess]]:
    root = tmp_path_factory.mktemp("streams")
    package = write_keywords(root / "kw")
    state = RedisProcess(root / "redis.log")
    worker: Proc = start_worker(root, package, state.url)
    server = Server(
        [
            str(package),
            "--redis",
            state.url,
            "--max-event-streams",
            str(MAX_STREAMS),
            "--max-event-streams-per-caller",
            str(MAX_STREAMS),
            "--event-stream-connections",
            str(STREAM_CONNECTIONS),
            "--max-connections",
            "2000",
        ],
        root / "server.log",
    )
    try:
        server.wait_ready()
        yield server, state
    finally:
        server.stop()
        worker.stop()
        state.stop()


def plant_running_job(state: RedisProcess, results: int = 0) -> str:
    """A job mid-run, as a worker leaves it: `results` lines stored and their events written."""
    job = "job_" + uuid.uuid4().hex
    now = time.time()
    client = redis.Redis.from_url(state.url)
    fields = {"surface": "embeddings", "model": "kw", "status": "running", "total": results + 1}
    fields |= {"done": results, "failed": 0, "cached": 0, "created_at": now, "expires_at": now + 600}
    client.hset(keys.job_key(job), mapping=fields)
    pipe = client.pipeline()
    for index in range(results):
        line = b'{"index":%d,"custom_id":null,"response":"%s"}' % (index, b"x" * LINE_BYTES)
        pipe.hset(keys.job_results_key(job), str(index), line)
        pipe.xadd(keys.job_events_key(job), {"event": "result", "index": str(index)})
    pipe.execute()
    return job


def open_stream(server: Server, job: str, *, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(f"GET /v1/jobs/{job}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def status_of(sock: socket.socket) -> int:
    head = sock.recv(12)
    return int(head[9:12])


def unread_bytes(sock: socket.socket) -> int:
    """What the kernel holds for `sock` that its reader has not read (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    return count[0]


def wait_windows_full(socks: list[socket.socket], timeout_s: float = 30.0) -> None:
    """Until every stream has reached its reader and none sends more: each socket holds unread
    bytes, and their total is the same two polls apart (each writer is stuck on a full window)."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        held = [unread_bytes(sock) for sock in socks]
        if all(held) and sum(held) == last:
            return
        assert time.monotonic() < deadline, f"streams still writing: {sorted(held)[:5]}..., {sum(held)} bytes"
        last = sum(held) if all(held) else -1
        time.sleep(0.5)


def rss_mib(server: Server) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def embed_latency_s(server: Server) -> float:
    started = time.monotonic()
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "refund parcel"}, timeout=10)
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def test_600_streams_past_a_small_cap_get_429_fast_and_requests_keep_answering(
    topology: tuple[Server, RedisProcess],
) -> None:
    server, state = topology
    job = plant_running_job(state)
    socks: list[socket.socket] = []
    statuses: list[int] = []
    refused_s: list[float] = []
    try:
        for _ in range(600):
            started = time.monotonic()
            sock = open_stream(server, job)
            socks.append(sock)
            statuses.append(status_of(sock))
            if statuses[-1] == 429:
                refused_s.append(time.monotonic() - started)
                sock.close()
        assert statuses.count(200) == MAX_STREAMS and statuses.count(429) == 600 - MAX_STREAMS
        assert max(refused_s) < 1.0, max(refused_s)
        # 110 streams share 8 Redis connections of their own: the request path keeps its pool.
        latencies = [embed_latency_s(server) for _ in range(20)]
        assert max(latencies) < 1.0, latencies
        assert httpx.get(server.url + "/v1/jobs/" + job, timeout=5).status_code == 200
    finally:
        for sock in socks:
            sock.close()
    # Their slots come back once they leave.
    deadline = time.monotonic() + 5
    while True:
        sock = open_stream(server, job)
        try:
            if status_of(sock) == 200:
                break
        finally:
            sock.close()
        assert time.monotonic() < deadline, "slots not released"
        time.sleep(0.1)
    assert "Too many connections" not in server.log()


def test_100_clients_that_never_read_hold_bounded_memory_released_when_they_leave(
    topology: tuple[Server, RedisProcess],
) -> None:
    server, state = topology
    job = plant_running_job(state, results=500)
    before = rss_mib(server)
    socks = [open_stream(server, job, rcvbuf=4096) for _ in range(100)]
    try:
        wait_windows_full(socks)
        during = rss_mib(server)
        print(f"replica RSS {before:.0f} -> {during:.0f} MiB with 100 readers that never read")
        assert during - before < RSS_GROWTH_BOUND_MIB, (before, during)
        assert embed_latency_s(server) < 1.0
    finally:
        for sock in socks:
            sock.close()
    # Gone readers release their streams: every slot can be taken again.
    deadline = time.monotonic() + 5
    while True:
        held = [open_stream(server, job) for _ in range(MAX_STREAMS)]
        ok = [status_of(s) for s in held]
        for sock in held:
            sock.close()
        if ok.count(200) == MAX_STREAMS:
            break
        assert time.monotonic() < deadline, ok.count(200)
        time.sleep(0.2)
    assert rss_mib(server) - before < RSS_GROWTH_BOUND_MIB

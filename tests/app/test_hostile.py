"""`serve` under a hostile or careless client (issue 22): real sockets on 127.0.0.1, one server
for the module, every test bounded in seconds."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from helpers import Server, read_until_closed, write_keywords

HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 60
MAX_QUEUED_JOB_ITEMS = 40
MAX_JOB_RESULT_BYTES = 1500


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    package = write_keywords(tmp_path_factory.mktemp("hostile") / "keywords")
    return module_server(
        str(package),
        "--header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--body-idle-s",
        "1",
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--max-queued-job-items",
        str(MAX_QUEUED_JOB_ITEMS),
        "--max-job-result-bytes",
        str(MAX_JOB_RESULT_BYTES),
    )


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def live_latency_s(server: Server) -> float:
    started = time.monotonic()
    assert httpx.get(server.url + "/health/live", timeout=5).status_code == 200
    return time.monotonic() - started


def test_silent_and_half_sent_connections_are_closed_and_the_server_answers(server: Server) -> None:
    socks = [connect(server) for _ in range(20)]
    for sock in socks[10:]:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
    body = connect(server)  # a body announced, a little sent, then nothing
    body.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"input": '
    )
    # Meanwhile the server answers others at once.
    assert live_latency_s(server) < 1.0
    started = time.monotonic()
    for sock in socks:
        got, _ = read_until_closed(sock, 5)
        assert got.startswith(b"HTTP/1.1 408"), got
    read_until_closed(body, 5)
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 2


def test_a_header_trickle_does_not_extend_the_deadline(server: Server) -> None:
    sock = connect(server)
    started = time.monotonic()
    for byte in b"GET /health/live HTTP/1.1\r\nX-Slow: " + b"a" * 30:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        # Each gap far inside the deadline, the whole head far past it.
        time.sleep(HEADER_TIMEOUT_S / 10)
    got, _ = read_until_closed(sock, 5)
    assert got.startswith(b"HTTP/1.1 408") and time.monotonic() - started < HEADER_TIMEOUT_S + 2


def test_a_kept_alive_connection_serves_request_after_request(server: Server) -> None:
    # The deadline is per request head, not per connection: slow traffic that is in time stays.
    # httpx would open a new connection for one the server had closed: the client's own
    # address tells whether all three went over one.
    addresses = set()
    with httpx.Client(base_url=server.url, timeout=5) as client:
        for i in range(3):
            if i:
                # The gaps add up past the head deadline, each well inside the keep-alive timeout
                # (ConnectionLimits.keep_alive_s): only a deadline counted per connection closes it.
                time.sleep(HEADER_TIMEOUT_S * 0.8)
            reply = client.get("/health/live")
            assert reply.status_code == 200
            addresses.add(reply.extensions["network_stream"].get_extra_info("client_addr"))
    assert len(addresses) == 1, addresses


def test_past_the_connection_cap_a_new_connection_gets_503(server: Server) -> None:
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    # No wait for them to be accepted: the server accepts in the order the connections were made,
    # so the next one is counted after these. A wait would only spend the time they have: being
    # silent, they are closed HEADER_TIMEOUT_S after their accept, and the cap with them.
    try:
        got, _ = read_until_closed(connect(server), 3)
        assert got.startswith(b"HTTP/1.1 503") and b"too many open connections" in got
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert live_latency_s(server) < 1.0
            return
        except (httpx.HTTPError, AssertionError):
            assert time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.parametrize("request_line", [b"GET * HTTP/1.1", b"OPTIONS * HTTP/1.1"])
def test_an_asterisk_target_is_400_not_500(server: Server, request_line: bytes) -> None:
    sock = connect(server)
    sock.sendall(request_line + b"\r\nHost: 127.0.0.1\r\n\r\n")
    got, _ = read_until_closed(sock, 5)
    assert got.startswith(b"HTTP/1.1 400") and b"request target" in got, got


def test_many_silent_connections_at_once_leave_health_fast(server: Server) -> None:
    stop = threading.Event()
    latencies: list[float] = []

    def probe() -> None:
        while not stop.is_set():
            latencies.append(live_latency_s(server))
            time.sleep(0.1)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        socks = [connect(server) for _ in range(MAX_CONNECTIONS - 5)]
        # Probing through the whole life of the silent connections: held, timed out, closed.
        time.sleep(HEADER_TIMEOUT_S + 0.5)
        for sock in socks:
            read_until_closed(sock, 3)
    finally:
        stop.set()
        prober.join(10)
    assert latencies and max(latencies) < 1.0, latencies


def create_job(server: Server, n: int) -> httpx.Response:
    body = "\n".join(json.dumps({"input": f"refund {i}", "custom_id": f"c{i}"}) for i in range(n))
    return httpx.post(
        f"{server.url}/v1/jobs?surface=classify",
        content=body.encode(),
        headers={"content-type": "application/x-ndjson"},
        timeout=30,
    )


def wait_done(server: Server, job_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while True:
        status: dict[str, object] = server.get(f"/v1/jobs/{job_id}").json()
        if status["status"] in ("completed", "failed", "cancelled"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def test_a_job_past_the_global_queued_items_is_429_naming_the_limit(server: Server) -> None:
    refused = create_job(server, MAX_QUEUED_JOB_ITEMS + 1)
    assert refused.status_code == 429 and refused.headers["retry-after"]
    error = refused.json()["error"]
    assert error["code"] == "overloaded" and "--max-queued-job-items" in error["message"]
    assert create_job(server, 5).status_code == 202


def test_results_past_a_jobs_bytes_are_stored_as_errors_and_the_job_ends(server: Server) -> None:
    created = create_job(server, 30)
    assert created.status_code == 202
    status = wait_done(server, created.json()["id"])
    assert status["status"] == "completed"
    lines = server.get(f"/v1/jobs/{created.json()['id']}/results?limit=100").json()["data"]
    stored = [x for x in lines if "response" in x]
    refused = [x for x in lines if "error" in x]
    assert stored and refused and len(stored) + len(refused) == 30
    assert sum(len(json.dumps(x, separators=(",", ":"))) for x in stored) <= MAX_JOB_RESULT_BYTES
    assert {x["error"]["code"] for x in refused} == {"result_too_large"}
    assert "--max-job-result-bytes" in refused[0]["error"]["message"]
    assert [x["custom_id"] for x in lines] == [f"c{i}" for i in range(30)]


# Browser-safe (M3): bodies only as JSON (NDJSON for jobs), and a Host allow-list by default.


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/classify", "text/plain"),
        ("/v1/classify", "application/x-www-form-urlencoded"),
        ("/v1/classify", "multipart/form-data; boundary=x"),
        ("/v1/classify", None),
        ("/v1/classify", "application/x-ndjson"),  # NDJSON is for jobs only
        ("/v1/jobs?surface=classify", "text/plain"),
    ],
)
def test_a_body_that_is_not_json_is_415(server: Server, path: str, content_type: str | None) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    body = b'{"input": "refund"}' if "jobs" not in path else b'{"input": "refund"}\n'
    reply = httpx.post(server.url + path, content=body, headers=headers, timeout=10)
    assert reply.status_code == 415, reply.text
    error = reply.json()["error"]
    assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]


def test_json_bodies_and_jobs_as_ndjson_are_read(server: Server) -> None:
    ok = httpx.post(
        server.url + "/v1/classify",
        content=b'{"input": "refund"}',
        headers={"content-type": "application/json; charset=utf-8"},
        timeout=10,
    )
    assert ok.status_code == 200, ok.text
    assert create_job(server, 1).status_code == 202
    # A body-less POST needs no content type (cancel).
    job_id = create_job(server, 1).json()["id"]
    assert httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel", timeout=10).status_code == 200


@pytest.mark.parametrize(
    "host", ["attacker.example", "attacker.example:8000", "10.0.0.1", "127.0.0.1.nip.io"]
)
def test_a_rebound_host_is_refused_without_a_key(server: Server, host: str) -> None:
    reply = httpx.post(
        server.url + "/v1/classify", json={"input": "refund"}, headers={"host": host}, timeout=10
    )
    error = reply.json()["error"]
    assert (
        reply.status_code == 400
        and error["code"] == "invalid_request"
        and "is not served here" in error["message"]
    )
    assert httpx.get(server.url + "/v1/models", headers={"host": host}, timeout=10).status_code == 400


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST:1234", "[::1]:8000"])
def test_the_bind_address_and_localhost_are_served(server: Server, host: str) -> None:
    reply = httpx.post(
        server.url + "/v1/classify", json={"input": "refund"}, headers={"host": host}, timeout=10
    )
    assert reply.status_code == 200, reply.text


def test_the_default_allow_list() -> None:
    from vllm_srun.app.guard import default_hosts, parse_hosts

    assert default_hosts("127.0.0.1", api_key=None) == {"127.0.0.1", "localhost", "::1"}
    assert default_hosts("192.168.1.5", api_key=None) == {"192.168.1.5", "127.0.0.1", "localhost", "::1"}
    assert default_hosts("127.0.0.1", api_key="k") is None  # the key protects it
    assert default_hosts("0.0.0.0", api_key=None) is None  # its names cannot be known
    assert parse_hosts("a.example, B.example") == {"a.example", "b.example"} and parse_hosts("*") is None

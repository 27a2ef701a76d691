"""Issue 22, part 1 under load (H1's first row): long texts cost one replica bounded memory and
never hold its event loop. Real sockets on 127.0.0.1, one embedded server for the module (app
and worker in one process), each test bounded in seconds.

Bounds stated here: the server's RSS grows by at most RSS_MARGIN_MIB over its idle figure while
three 3.4 MB texts are in flight (it grew by over 1 GiB when they were tokenized whole), and
/health/live answers each probe within LIVE_BOUND_S (it took 7 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from helpers import Server

from vllm_srun.families.task_heads.windows import CHARS_PER_TOKEN, MAX_WINDOWS

LIVE_BOUND_S = 1.0
RSS_MARGIN_MIB = 100
MAX_INPUTS = 8
MAX_TOKENS = 128  # the bert-embedding fixture's max_position_embeddings
LONG_TEXT = ("hello world the movie was good " * 120_000)[:3_400_000]  # 3.4 MB, ~650k tokens
# Inside the cap under 'truncate' (MAX_TOKENS x CHARS_PER_TOKEN x MAX_WINDOWS chars): tokenized.
TRUNCATED_TEXT = LONG_TEXT[: MAX_TOKENS * CHARS_PER_TOKEN * MAX_WINDOWS - 1000]


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    package = write_fixture(tmp_path_factory.mktemp("load") / "emb", variant="bert-embedding")
    return module_server(str(package), "--max-inputs", str(MAX_INPUTS), "--max-concurrent-requests", "3")


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


@contextmanager
def probing(server: Server) -> Iterator[dict[str, float]]:
    """Probes /health/live and samples the server's RSS every 50 ms while the block runs;
    yields the worst latency and the peak RSS seen (filled in when the block ends)."""
    seen = {"live_s": 0.0, "rss_mib": rss_mib(server.proc.pid)}
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=30.0) as client:
            while not stop.is_set():
                started = time.monotonic()
                assert client.get(server.url + "/health/live").status_code == 200
                seen["live_s"] = max(seen["live_s"], time.monotonic() - started)
                seen["rss_mib"] = max(seen["rss_mib"], rss_mib(server.proc.pid))
                stop.wait(0.05)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def post_all(server: Server, bodies: list[dict]) -> list[httpx.Response]:
    answers: list[httpx.Response] = []

    def send(body: dict) -> None:
        answers.append(httpx.post(server.url + "/v1/embeddings", json=body, timeout=60.0))

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_long_texts_are_refused_before_tokenizing(server: Server) -> None:
    idle_mib = rss_mib(server.proc.pid)
    with probing(server) as seen:
        answers = post_all(server, [{"input": LONG_TEXT}] * 3)
    for answer in answers:
        # Under reject (the default) it is the answer any overlong input gets (upstream's 400),
        # its token count a lower bound: only the first MAX_TOKENS * CHARS_PER_TOKEN
        # characters were tokenized.
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "input"
        assert "input: input has at least" in error["message"], error["message"]
    assert seen["live_s"] < LIVE_BOUND_S, seen
    assert seen["rss_mib"] - idle_mib < RSS_MARGIN_MIB, (idle_mib, seen)
    # Still answered in place: a text of the same words inside the cap.
    assert server.post("/v1/embeddings", {"input": LONG_TEXT[:400]}).status_code == 200
    # With reject named, the long input fails alone, its siblings answered.
    both = server.post("/v1/embeddings", {"input": [LONG_TEXT, "good"], "options": {"overflow": "reject"}})
    assert both.status_code == 200, both.text
    first, second = both.json()["data"]
    assert first["error"] == "max_length_exceeded" and "characters" in first["message"]
    assert len(second["embedding"]) > 0


def test_a_document_truncated_whole_does_not_hold_the_loop(server: Server) -> None:
    """Under 'truncate' a text up to the cap is tokenized whole (its token count is reported):
    on the planner threads, with the GIL released, while the loop answers."""
    with probing(server) as seen:
        answers = post_all(server, [{"input": TRUNCATED_TEXT, "options": {"overflow": "truncate"}}] * 3)
    assert [a.status_code for a in answers] == [200] * 3, answers[0].text
    assert seen["live_s"] < LIVE_BOUND_S, seen
    # Past the cap under 'truncate' too: 413 naming the input.
    answer = server.post("/v1/embeddings", {"input": [LONG_TEXT], "options": {"overflow": "truncate"}})
    assert answer.status_code == 413 and answer.json()["error"]["param"] == "input[0]", answer.text


def test_past_max_concurrent_requests_is_429_with_retry_after(server: Server) -> None:
    slow = {"input": TRUNCATED_TEXT, "options": {"overflow": "truncate"}}
    held: list[int] = []

    def hold() -> None:
        # A holder that met a probe in its slot tries again: all three get a slot in the end.
        while (status := post_all(server, [slow])[0].status_code) == 429:
            pass
        held.append(status)

    holders = [threading.Thread(target=hold) for _ in range(3)]
    for thread in holders:
        thread.start()
    # Until the three are read and planning (each takes over a second): a probe answered 429.
    # Each probe before that takes a slot for a moment only.
    deadline = time.monotonic() + 30
    while (answer := server.post("/v1/embeddings", {"input": "hello"})).status_code != 429:
        assert any(t.is_alive() for t in holders), "the holders ended before any probe met a full replica"
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.02)
    for thread in holders:
        thread.join()
    assert held == [200] * 3, held
    assert answer.status_code == 429, answer.text
    assert answer.headers["retry-after"] == "1"
    assert "--max-concurrent-requests" in answer.json()["error"]["message"]
    assert server.post("/v1/embeddings", {"input": "hello"}).status_code == 200


def test_a_bundle_counts_its_inputs_together(server: Server) -> None:
    task = {"input": ["hello world"] * 3}
    answer = server.post("/v1/bundle", {"tasks": [{"id": str(i), "embeddings": task} for i in range(3)]})
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert error["param"] == "tasks" and f"9 inputs in all; at most {MAX_INPUTS}" in error["message"]
    two = server.post("/v1/bundle", {"tasks": [{"id": str(i), "embeddings": task} for i in range(2)]})
    assert two.status_code == 200 and [r["status"] for r in two.json()["results"]] == [200, 200]


def test_a_large_jsonl_job_is_validated_off_the_loop_in_bounded_memory(server: Server) -> None:
    """H1: a 1,000,000-line JSONL job was read whole, decoded whole and validated on the event
    loop (RSS +858 MiB, /health/live 3.2 s on an embedded serve). Now the default cap
    (--max-job-requests 100,000) refuses one line past it, and a job at the cap is validated
    line by line in a thread: RSS grows by less than RSS_MARGIN_MIB, /health/live within bound."""
    from vllm_srun import defaults

    def jsonl(count: int) -> bytes:
        return b"".join(b'{"input": "good movie %d"}\n' % i for i in range(count))

    headers = {"content-type": "application/x-ndjson"}
    over = httpx.post(
        server.url + "/v1/jobs?surface=embeddings",
        content=jsonl(defaults.MAX_JOB_REQUESTS + 1),
        headers=headers,
        timeout=120.0,
    )
    assert over.status_code == 413, over.text
    assert "--max-job-requests" in over.json()["error"]["message"]
    idle_mib = rss_mib(server.proc.pid)
    with probing(server) as seen:
        created = httpx.post(
            server.url + "/v1/jobs?surface=embeddings",
            content=jsonl(defaults.MAX_JOB_REQUESTS),
            headers=headers,
            timeout=120.0,
        )
    assert created.status_code == 202, created.text
    httpx.post(server.url + f"/v1/jobs/{created.json()['id']}/cancel", timeout=30.0)
    assert seen["live_s"] < LIVE_BOUND_S, seen
    assert seen["rss_mib"] - idle_mib < RSS_MARGIN_MIB, (idle_mib, seen)

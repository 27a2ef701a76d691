"""The bulk job API over real HTTP, on one embedded server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest
from helpers import Server, write_keywords


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    return module_server(
        str(write_keywords(tmp_path_factory.mktemp("pkg") / "kw")), "--served-model-name", "kw"
    )


def jsonl(lines: list[object]) -> bytes:
    return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines).encode()


def create(server: Server, body: bytes, query: str = "surface=classify", **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/jobs?{query}",
        content=body,
        headers={"content-type": "application/x-ndjson", **headers},
        timeout=30,
    )


def wait_done(server: Server, job_id: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        status = server.get(f"/v1/jobs/{job_id}").json()
        if status["status"] in ("completed", "failed", "cancelled"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def test_jsonl_job_runs_in_input_order_with_custom_ids(server: Server) -> None:
    lines = [{"input": ["refund"], "custom_id": "a"}, {"input": "parcel"}, {"input": ["hello", "invoice"]}]
    created = create(server, jsonl(lines))
    assert created.status_code == 202
    body = created.json()
    assert body["status"] == "queued" and body["counts"]["total"] == 3
    status = wait_done(server, body["id"])
    assert status["status"] == "completed" and status["counts"]["done"] == 3
    assert status["started_at"] >= status["created_at"] and status["finished_at"] >= status["started_at"]
    results = server.get(f"/v1/jobs/{body['id']}/results").json()
    assert [r["custom_id"] for r in results["data"]] == ["a", None, None]
    labels = [[x["label"] for x in r["response"]["results"]] for r in results["data"]]
    assert labels == [["billing"], ["shipping"], ["other", "billing"]]
    page = server.get(f"/v1/jobs/{body['id']}/results?offset=1&limit=1").json()
    assert [r["index"] for r in page["data"]] == [1] and page["has_more"] is True
    as_lines = server.get(f"/v1/jobs/{body['id']}/results", headers={"accept": "application/x-ndjson"})
    assert [json.loads(x)["index"] for x in as_lines.text.splitlines()] == [0, 1, 2]


def test_json_body_and_embeddings_surface(server: Server) -> None:
    r = server.post(
        "/v1/jobs", {"surface": "embeddings", "requests": [{"input": "refund"}, {"input": ["a", "b"]}]}
    )
    assert r.status_code == 202, r.text
    status = wait_done(server, r.json()["id"])
    data = server.get(f"/v1/jobs/{status['id']}/results").json()["data"]
    assert len(data[1]["response"]["data"]) == 2 and data[0]["response"]["object"] == "list"


def test_a_bad_line_rejects_the_job_naming_the_line(server: Server) -> None:
    r = create(server, jsonl([{"input": "ok"}, "{oops", {"input": "fine"}]))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("line 2:")
    r = create(server, jsonl([{"input": "ok"}, {"input": "x", "options": {"colour": 1}}]))
    assert r.status_code == 400 and "line 2" in r.json()["error"]["message"] and "colour" in r.text


def test_on_error_record_keeps_the_rest(server: Server) -> None:
    r = create(
        server, jsonl([{"input": "refund"}, "{oops", {"inputs": "x"}]), "surface=classify&on_error=record"
    )
    assert r.status_code == 202
    status = wait_done(server, r.json()["id"])
    assert status["counts"] == {"total": 3, "done": 1, "failed": 2, "cached": status["counts"]["cached"]}
    data = server.get(f"/v1/jobs/{status['id']}/results").json()["data"]
    assert "response" in data[0]
    assert data[1]["error"]["message"].startswith("line 2") and "inputs" in data[2]["error"]["message"]


def test_job_errors(server: Server) -> None:
    assert server.get("/v1/jobs/job_nope").json()["error"]["code"] == "job_not_found"
    assert create(server, jsonl([{"input": "x"}]), "surface=decode").status_code == 400
    assert create(server, jsonl([{"input": "x"}]), "surface=classify&model=other").status_code == 404
    assert create(server, b'{"input": "x"}', "").status_code == 400  # no surface


def test_idempotency_key_returns_the_same_job(server: Server) -> None:
    first = create(server, jsonl([{"input": "refund"}]), **{"idempotency-key": "k-1"})
    again = create(server, jsonl([{"input": "refund"}]), **{"idempotency-key": "k-1"})
    other = create(server, jsonl([{"input": "refund"}]), **{"idempotency-key": "k-2"})
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"] != other.json()["id"]


def test_an_idempotency_key_sent_with_another_request_is_422(server: Server) -> None:
    first = create(server, jsonl([{"input": "refund"}]), **{"idempotency-key": "k-bound"})
    assert first.status_code == 202
    # Another body, or the same body for another surface: not that job, and nothing of it shown.
    for body, query in (
        (jsonl([{"input": "parcel"}]), "surface=classify"),
        (jsonl([{"input": "refund"}]), "surface=embeddings"),
    ):
        reused = create(server, body, query, **{"idempotency-key": "k-bound"})
        assert reused.status_code == 422, reused.text
        assert reused.json()["error"]["code"] == "idempotency_key_reused"
        assert first.json()["id"] not in reused.text
    assert (
        create(server, jsonl([{"input": "refund"}]), **{"idempotency-key": "k-bound"}).json()["id"]
        == first.json()["id"]
    )


def test_cancel_and_events_resume(server: Server) -> None:
    total = 3000  # 12 chunks: more than the worker runs at once, so a cancel skips some
    r = create(
        server,
        jsonl([{"input": f"refund {'parcel ' * (i % 400)}{'charge ' * (i // 400)}"} for i in range(total)]),
    )
    job_id = r.json()["id"]
    cancelled = httpx.post(f"{server.url}/v1/jobs/{job_id}/cancel").json()
    assert cancelled["status"] in ("cancelling", "cancelled", "completed")
    status = wait_done(server, job_id)
    assert status["counts"]["done"] + status["counts"]["failed"] == total
    assert status["status"] == "cancelled" and status["counts"]["failed"] > 0
    events = []
    with httpx.stream("GET", f"{server.url}/v1/jobs/{job_id}/events", timeout=30) as stream:
        event_id = event = None
        for line in stream.iter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                events.append((event_id, event, json.loads(line[5:])))
    results = [e for e in events if e[1] == "result"]
    assert len({e[2]["index"] for e in results}) == len(results) == total
    assert events[-1][1] == "status" and events[-1][2]["status"] == status["status"]
    middle = results[total // 2 - 1][0]
    with httpx.stream("GET", f"{server.url}/v1/jobs/{job_id}/events", headers={"last-event-id": middle}) as s:
        resumed = [json.loads(line[5:]) for line in s.iter_lines() if line.startswith("data:")]
    indices = [e["index"] for e in resumed if "index" in e]
    assert indices == [e[2]["index"] for e in results[total // 2 :]]


def sse(server: Server, job_id: str, last_event_id: str | None = None) -> list[tuple[str, str]]:
    """(id, event) of each event the stream sends until it ends."""
    headers = {"last-event-id": last_event_id} if last_event_id else {}
    events, event_id = [], ""
    with httpx.stream("GET", f"{server.url}/v1/jobs/{job_id}/events", headers=headers, timeout=30) as s:
        assert s.status_code == 200
        for line in s.iter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("event:"):
                events.append((event_id, line[6:].strip()))
    return events


def test_crafted_job_ids_and_event_ids(server: Server) -> None:
    job_id = create(server, jsonl([{"input": "refund"}, {"input": "parcel"}])).json()["id"]
    wait_done(server, job_id)
    # A job's other keys are not jobs: each is a 404, not a 500 from the wrong Redis type.
    for suffix in (":results", ":events", ":requests", ":custom_ids", ":chunks"):
        for path in ("", "/results", "/events"):
            r = server.get(f"/v1/jobs/{job_id}{suffix}{path}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found", (suffix, path)
        assert httpx.post(f"{server.url}/v1/jobs/{job_id}{suffix}/cancel").status_code == 404
    # A malformed Last-Event-ID is refused before the stream starts, naming the header.
    for malformed in ("garbage", "20000000000000000000", "1-20000000000000000000"):
        r = server.get(f"/v1/jobs/{job_id}/events", headers={"last-event-id": malformed})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("Last-Event-ID:"), malformed
    # The largest id the header admits is one Redis reads: the stream ends with the status.
    assert sse(server, job_id, "9999999999999999999-9999999999999999999")[-1][1] == "status"
    # Resumed at the final event: the stream still ends with the status, so clients stop.
    events = sse(server, job_id)
    assert [e for _, e in events if e != "progress"] == ["result", "result", "status"]
    assert sse(server, job_id, events[-1][0]) == [(events[-1][0], "status")]


def test_job_bodies_with_bad_bytes_or_depth(server: Server) -> None:
    bad = b'{"input": "\xff"}'
    r = create(server, b'{"input": "refund"}\n' + bad, "surface=classify&on_error=record")
    assert r.status_code == 202, r.text
    data = server.get(f"/v1/jobs/{wait_done(server, r.json()['id'])['id']}/results").json()["data"]
    assert data[0]["response"]["results"][0]["label"] == "billing"
    assert data[1]["error"]["message"].startswith("line 2: not JSON")
    with_bom = create(server, b"\xef\xbb\xbf" + jsonl([{"input": "refund"}]))  # as editors on Windows save
    assert with_bom.status_code == 202, with_bom.text
    rejected = create(server, bad)
    assert rejected.status_code == 400 and rejected.json()["error"]["message"].startswith("line 1:")
    deep = httpx.post(
        f"{server.url}/v1/jobs",
        content=b'{"surface": "classify", "requests": [{"input": ' + b"[" * 1500 + b"]" * 1500 + b"}]}",
        headers={"content-type": "application/json"},
    )
    assert deep.status_code == 400 and "not JSON" in deep.json()["error"]["message"]


def test_job_lines_decode_as_the_surfaces_do(server: Server) -> None:
    # The surface endpoint refuses "100000" for a number, as the document types it; so does a job
    # line (and both take 100000.0 for an integer).
    line = {"input": "refund", "options": {"deadline_ms": "100000"}}
    assert server.post("/v1/classify", line).status_code == 400
    whole = {"input": "refund", "options": {"max_tokens": 8.0}}
    assert server.post("/v1/classify", whole).status_code == 200
    created = create(server, jsonl([whole, {"input": []}, line]), "surface=classify&on_error=record")
    assert created.status_code == 202
    data = server.get(f"/v1/jobs/{wait_done(server, created.json()['id'])['id']}/results").json()["data"]
    assert data[0]["response"]["results"][0]["label"] == "billing"
    assert "deadline_ms" in data[2]["error"]["message"]
    # An empty input is refused up front, as the surface endpoint refuses it.
    assert data[1]["error"]["message"].startswith("line 2: input")
    assert server.post("/v1/classify", {"input": []}).status_code == 400
    for custom_id in (0, False, [], 5):
        r = create(server, jsonl([{"input": "refund", "custom_id": custom_id}]))
        assert r.status_code == 400 and "custom_id" in r.json()["error"]["message"], custom_id
    # A JSON body without on_error takes the query's.
    r = httpx.post(
        f"{server.url}/v1/jobs?on_error=record",
        json={"surface": "classify", "requests": [{"input": "refund"}, {"inputs": "x"}]},
    )
    assert r.status_code == 202 and wait_done(server, r.json()["id"])["counts"]["failed"] == 1

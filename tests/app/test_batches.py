"""OpenAI's Batch API through the real `openai` client against `vllm-srun serve` (MiniLM):
upload, create, poll, download, cancel, list; each output body equals the interactive answer."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.helpers import Server


@pytest.fixture
def client(minilm_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{minilm_server.url}/v1", api_key="unused")


def _jsonl(rows: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def _done(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    deadline = time.monotonic() + 30
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired") or time.monotonic() > deadline:
            return batch
        time.sleep(0.05)


def test_a_batch_answers_each_line_as_the_route_does(client: openai.OpenAI, minilm_server: Server) -> None:
    bodies = [
        {"model": "minilm", "input": ["a quiet lake", "the stock market fell"]},
        {"model": "minilm", "input": "one text"},
        {"model": "minilm", "input": "x", "colour": 1},  # refused alone (unknown field)
    ]
    rows = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for i, body in enumerate(bodies)
    ]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(rows)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(_jsonl(rows))
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h", metadata={"k": "v"}
    )
    assert created.status == "in_progress" and created.metadata == {"k": "v"}
    batch = _done(client, created.id)
    assert batch.status == "completed", client.files.content(batch.error_file_id or "").text
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        3,
        2,
        1,
    )
    assert batch.completed_at is not None and batch.in_progress_at is not None
    assert batch.output_file_id and batch.error_file_id
    output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in output] == ["r0", "r1"]
    raw_lines = client.files.content(batch.output_file_id).content.splitlines()
    for line, raw, body in zip(output, raw_lines, bodies, strict=False):
        assert line["response"]["status_code"] == 200 and line["error"] is None
        interactive = httpx.post(f"{minilm_server.url}/v1/embeddings", json=body).content
        # Bit for bit: the body sits verbatim inside the line.
        assert b'"body":' + interactive + b'},"error":null}' in raw
    errors = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
    assert [line["custom_id"] for line in errors] == ["r2"]
    assert errors[0]["response"]["status_code"] == 400
    assert client.batches.list(limit=100).data[0].id == created.id


def test_a_malformed_file_fails_in_validation_with_line_numbers(client: openai.OpenAI) -> None:
    good = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
    content = _jsonl([good]) + b"{not json\n" + _jsonl([{**good, "url": "/v1/rerank", "custom_id": "b"}])
    uploaded = client.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data is not None
    assert [(e.line, e.code) for e in batch.errors.data] == [
        (2, "invalid_json_line"),
        (3, "mismatched_endpoint"),
    ]


def test_cancel_and_files(client: openai.OpenAI) -> None:
    rows = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": f"text {i}"}}
        for i in range(200)
    ]
    uploaded = client.files.create(file=("c.jsonl", _jsonl(rows)), purpose="batch")
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    cancelled = client.batches.cancel(created.id)
    assert cancelled.status in ("cancelling", "cancelled", "completed")
    batch = _done(client, created.id)
    assert batch.status in ("cancelled", "completed")
    assert batch.request_counts is not None and batch.request_counts.total == 200
    assert client.files.retrieve(uploaded.id).filename == "c.jsonl"
    assert uploaded.id in [f.id for f in client.files.list()]
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_" + "0" * 32)

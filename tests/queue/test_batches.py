"""BatchStore on a real Redis, and a batch file's lines read and written."""

from __future__ import annotations

import msgspec
import pytest
from arq.connections import ArqRedis

from vllm_srun.app.peers.openai_batch import lines
from vllm_srun.errors import BatchNotFound, FileNotFound
from vllm_srun.queue.jobs.batches import BatchStore


async def test_a_file_is_its_callers_alone(redis: ArqRedis) -> None:
    store = BatchStore(redis, ttl_s=60)
    made = await store.put_file(owner="a", filename="in.jsonl", purpose="batch", content=b"x\n")
    assert made["bytes"] == "2"
    assert (await store.file(made["id"], owner="a"))["filename"] == "in.jsonl"
    assert await store.content(made["id"]) == b"x\n"
    with pytest.raises(FileNotFound):
        await store.file(made["id"], owner="b")
    with pytest.raises(FileNotFound):
        await store.file("file-../../etc", owner="a")
    assert (await store.listed("file", owner="a", after=None, limit=10))[0] == [made["id"]]
    assert (await store.listed("file", owner="b", after=None, limit=10))[0] == []
    await store.delete_file(made["id"], owner="a")
    with pytest.raises(FileNotFound):
        await store.file(made["id"], owner="a")


async def test_batches_list_newest_first_and_note_once(redis: ArqRedis) -> None:
    store = BatchStore(redis, ttl_s=60)
    first = await store.put_batch({"endpoint": "/v1/embeddings"}, owner="a")
    second = await store.put_batch({"endpoint": "/v1/embeddings"}, owner="a")
    ids, more = await store.listed("batch", owner="a", after=None, limit=1)
    assert (ids, more) == ([second["id"]], True)
    assert (await store.listed("batch", owner="a", after=second["id"], limit=5))[0] == [first["id"]]
    assert await store.note(first["id"], {"completed": 3})
    assert not await store.note(first["id"], {"completed": 4})
    assert (await store.batch(first["id"], owner="a"))["completed"] == "3"
    with pytest.raises(BatchNotFound):
        await store.batch(first["id"], owner="b")


def _line(custom_id: str, url: str = "/v1/embeddings", **extra: object) -> bytes:
    body = {"custom_id": custom_id, "method": "POST", "url": url, "body": {"input": "hi"}, **extra}
    return msgspec.json.encode(body)


def test_a_good_file_parses_in_order() -> None:
    content = b"\n".join([_line("a"), b"", _line("b")])
    parsed = lines.parse(content, endpoint="/v1/embeddings", max_lines=10)
    assert parsed.errors == []
    assert [(n, c) for n, c, _ in parsed.entries] == [(1, "a"), (3, "b")]


def test_a_malformed_file_names_each_bad_line() -> None:
    content = b"\n".join(
        [_line("a"), b"{nope", _line("a"), _line("c", url="/v1/rerank"), _line("d", method="GET")]
    )
    parsed = lines.parse(content, endpoint="/v1/embeddings", max_lines=10)
    assert [(e.line, e.code) for e in parsed.errors] == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "mismatched_endpoint"),
        (5, "invalid_method"),
    ]
    assert lines.parse(b"", endpoint="/v1/embeddings", max_lines=10).errors[0].code == "empty_file"
    too_many = lines.parse(b"\n".join([_line("a"), _line("b")]), endpoint="/v1/embeddings", max_lines=1)
    assert too_many.errors[0].code == "too_many_requests"


def test_an_output_line_keeps_the_body_verbatim() -> None:
    body = b'{"data":[{"embedding":[0.1,0.30000000000000004]}]}'
    line = msgspec.json.decode(lines.output_line("batch_x", "a", 0, 200, body))
    assert line["custom_id"] == "a" and line["error"] is None
    assert line["response"]["status_code"] == 200
    assert msgspec.json.encode(line["response"]["body"]) == body
    again = msgspec.json.decode(lines.output_line("batch_x", "a", 0, 200, body))
    assert again["id"] == line["id"] and line["id"].startswith("batch_req_")

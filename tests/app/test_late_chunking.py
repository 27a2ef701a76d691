"""Late chunking over HTTP (`late_chunking` on /v1/embeddings) against a reference built from
Transformers' token states: the document `[CLS] chunk₁ … chunkₙ [SEP]` (each chunk tokenized
alone, without special tokens) through the architecture's Transformers model, then each chunk's
span pooled as the package's 1_Pooling says and normalised where modules.json has a Normalize.

The real all-MiniLM-L6-v2 at 1e-5, through the official `openai` client; every long-context
architecture's random-weight fixture (ModernBERT, NomicBERT, GTE, XLM-RoBERTa) at 1e-4.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import random_texts
from helpers import Server, minilm_dir, ok, serve_named

LONG_CONTEXT = ("modernbert-embedding", "nomic-bert-embedding", "gte-embedding", "xlm-roberta-embedding")
FIXTURE_ATOL = 1e-4
MINILM_ATOL = 1e-5
MINILM_CHUNKS = [
    "Berlin is the capital and largest city of Germany.",
    "Its more than 3.85 million inhabitants make it the most populous city of the European Union.",
    "The city is also one of the states of Germany, and the third smallest state in the country.",
]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("late-chunking")
    return {v: write_fixture(root / v, variant=v) for v in (*LONG_CONTEXT, "bert-sequence", "bert-splade")}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named(packages))


def chunk_ids(path: Path, chunks: list[str]) -> tuple[list[int], list[list[int]]]:
    """(the document's token ids, each chunk's ids) as the package's tokenizer gives them."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    first, last = tokenizer.encode("", add_special_tokens=True).ids  # [CLS] [SEP] or <s> </s>
    ids = [tokenizer.encode(c, add_special_tokens=False).ids for c in chunks]
    return [first, *(i for one in ids for i in one), last], ids


def reference(path: Path, chunks: list[str]) -> np.ndarray:
    """Each chunk's vector from Transformers' last_hidden_state of the whole document."""
    import torch
    import transformers

    config = json.loads((path / "config.json").read_text())
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    modules = json.loads((path / "modules.json").read_text())
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    cls = pooling.get("pooling_mode_cls_token", False)
    assert cls or pooling.get("pooling_mode_mean_tokens", False)
    document, ids = chunk_ids(path, chunks)
    model_class = getattr(transformers, config["architectures"][0])
    model = model_class.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        states = model(input_ids=torch.tensor([document])).last_hidden_state[0].double().numpy()
    vectors, start = [], 1
    for one in ids:
        span = states[start : start + len(one)]
        start += len(one)
        vector = span[0] if cls else span.mean(axis=0)
        vectors.append(vector / np.linalg.norm(vector) if normalize else vector)
    return np.stack(vectors)


def error_of(server: Server, body: dict[str, Any], status: int = 400) -> dict[str, str]:
    response = server.post("/v1/embeddings", body)
    assert response.status_code == status, response.text
    error: dict[str, str] = response.json()["error"]
    return error


def test_minilm_through_the_openai_client_equals_transformers(minilm_server: Server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused")
    got = client.embeddings.create(model="minilm", input=MINILM_CHUNKS, extra_body={"late_chunking": True})
    vectors = np.array([d.embedding for d in got.data])
    want = reference(minilm_dir(), MINILM_CHUNKS)
    assert float(np.abs(vectors - want).max()) < MINILM_ATOL
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    document, _ = chunk_ids(minilm_dir(), MINILM_CHUNKS)
    assert got.usage.prompt_tokens == len(document)
    # docs/api/index.md's retrieval example: the chunk that calls Berlin "its" ranks first for
    # a question about Berlin's people only when it is read in its document.
    alone = np.array(
        [d.embedding for d in client.embeddings.create(model="minilm", input=MINILM_CHUNKS).data]
    )
    query = client.embeddings.create(model="minilm", input=["How many people live in Berlin?"]).data[0]
    assert int(np.argmax(alone @ query.embedding)) == 0
    assert int(np.argmax(vectors @ query.embedding)) == 1


@pytest.mark.parametrize("variant", LONG_CONTEXT)
def test_long_context_fixtures_equal_transformers(
    server: Server, packages: dict[str, Path], variant: str
) -> None:
    chunks = random_texts(seed=len(variant), count=4, max_words=12)
    body = ok(
        server, "/v1/embeddings", {"model": variant, "input": chunks, "options": {"late_chunking": True}}
    )
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert float(np.abs(vectors - reference(packages[variant], chunks)).max()) < FIXTURE_ATOL
    _, ids = chunk_ids(packages[variant], chunks)
    assert [d["input"]["tokens"] for d in body["data"]] == [len(i) for i in ids]


def test_a_single_input_is_a_document_of_one_chunk(server: Server, packages: dict[str, Path]) -> None:
    variant = "xlm-roberta-embedding"
    text = random_texts(seed=3, count=1, max_words=20)[0]
    body = ok(server, "/v1/embeddings", {"model": variant, "input": text, "late_chunking": True})
    (vector,) = [d["embedding"] for d in body["data"]]
    assert float(np.abs(np.array(vector) - reference(packages[variant], [text])[0]).max()) < FIXTURE_ATOL
    # false is a plain request: its vector pools the special tokens too.
    plain = ok(server, "/v1/embeddings", {"model": variant, "input": text, "late_chunking": False})
    assert plain == ok(server, "/v1/embeddings", {"model": variant, "input": text})
    assert plain["data"][0]["embedding"] != vector


def test_the_document_is_cached_apart_from_plain_requests(server: Server, packages: dict[str, Path]) -> None:
    variant = "gte-embedding"
    chunks = random_texts(seed=11, count=3, max_words=10)
    body = {"model": variant, "input": chunks, "late_chunking": True, "options": {"return_meta": True}}
    first, second = ok(server, "/v1/embeddings", body), ok(server, "/v1/embeddings", body)
    assert first["meta"]["cache"] == {"hits": 0, "misses": 1}  # one forward for the document
    assert second["meta"]["cache"] == {"hits": 1, "misses": 0}
    assert first["data"] == second["data"] and len(first["data"]) == 3
    # The same token ids asked for plainly are another entry, with another answer.
    document, _ = chunk_ids(packages[variant], chunks)
    plain = ok(
        server, "/v1/embeddings", {"model": variant, "input": document, "options": {"return_meta": True}}
    )
    assert plain["meta"]["cache"] == {"hits": 0, "misses": 1}


def test_refusals_name_the_field(server: Server) -> None:
    model = "modernbert-embedding"
    words = random_texts(seed=5, count=1, max_words=100)[0]
    over = error_of(server, {"model": model, "input": [words, words], "late_chunking": True})
    assert over["param"] == "input" and "takes at most 128" in over["message"], over
    bad = error_of(server, {"model": model, "input": ["a"], "late_chunking": "yes"})
    assert bad["param"] == "late_chunking", bad
    both = {"model": model, "input": ["a"], "late_chunking": True, "options": {"late_chunking": False}}
    assert error_of(server, both)["param"] == "late_chunking"
    window = {"model": model, "input": ["a"], "late_chunking": True, "options": {"overflow": "window"}}
    assert error_of(server, window)["param"] == "options.overflow"
    assert error_of(server, {"model": model, "input": [[5, 6]], "late_chunking": True})["param"] == "input"
    assert (
        error_of(server, {"model": model, "input": ["a", ""], "late_chunking": True})["param"] == "input[1]"
    )
    classifier = error_of(server, {"model": "bert-sequence", "input": ["a"], "late_chunking": True}, 422)
    assert "embeddings" in classifier["message"]
    sparse = error_of(server, {"model": "bert-splade", "input": ["a"], "late_chunking": True}, 422)
    assert sparse["param"] == "late_chunking", sparse
    output = {"model": model, "input": ["a"], "late_chunking": True, "options": {"output": "tokens"}}
    assert error_of(server, output)["param"] == "options.output"


def test_a_bulk_job_answers_as_the_route_does(server: Server) -> None:
    line = {"model": "nomic-bert-embedding", "input": random_texts(seed=9, count=3, max_words=8)}
    line["late_chunking"] = True
    interactive = ok(server, "/v1/embeddings", line)
    job = server.post("/v1/jobs", {"surface": "embeddings", "model": line["model"], "requests": [line]})
    assert job.status_code == 202, job.text
    deadline = time.monotonic() + 30
    while (status := server.get(f"/v1/jobs/{job.json()['id']}").json())["status"] not in (
        "completed",
        "failed",
    ):
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert status["status"] == "completed", status
    (result,) = server.get(f"/v1/jobs/{status['id']}/results").json()["data"]
    assert result["response"]["data"] == interactive["data"]

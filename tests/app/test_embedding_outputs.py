"""Sparse, multi-vector and token outputs over HTTP: `options.output` on /v1/embeddings and
/v1/rerank, TEI's /embed_sparse and /embed_all, the result cache and bulk jobs.

The numbers are checked against the reference formulas computed from Transformers
(tests/families/task_heads/test_outputs.py) at 1e-5.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.output_references import ATOL, TEXTS, bge_m3_reference, splade_reference
from helpers import Server, ok, tei_error


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("output-packages")
    variants = ("bert-splade", "xlm-roberta-bge-m3", "bert-embedding")
    return {v: write_fixture(root / v, variant=v) for v in variants}


@pytest.fixture(scope="module")
def splade(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["bert-splade"]), "--max-inputs", "8")


@pytest.fixture(scope="module")
def m3(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["xlm-roberta-bge-m3"]))


def wait_done(server: Server, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        status: dict[str, Any] = server.get(f"/v1/jobs/{job_id}").json()
        if status["status"] in ("completed", "failed", "cancelled"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def _sparse_gap(pairs: dict[int, float], reference: dict[int, float]) -> float:
    assert set(pairs) == set(reference)
    return max(abs(pairs[i] - reference[i]) for i in reference)


def test_embed_sparse_is_splade_in_teis_shape(splade: Server, packages: dict[str, Path]) -> None:
    reference = splade_reference(packages["bert-splade"], TEXTS)
    tei = ok(splade, "/embed_sparse", {"inputs": TEXTS})
    assert all(set(v) == {"index", "value"} for row in tei for v in row)
    worst = max(
        _sparse_gap({v["index"]: v["value"] for v in row}, ref)
        for row, ref in zip(tei, reference, strict=True)
    )
    assert worst < ATOL
    ours = ok(splade, "/v1/embeddings", {"input": TEXTS, "options": {"output": "sparse"}})["data"]
    for row, item in zip(tei, ours, strict=True):
        assert [v["index"] for v in row] == item["sparse_embedding"]["indices"]
        assert [v["value"] for v in row] == item["sparse_embedding"]["values"]


def test_embed_all_is_every_token_state(m3: Server, packages: dict[str, Path]) -> None:
    _, _, _, tokens = bge_m3_reference(packages["xlm-roberta-bge-m3"], TEXTS)
    body = ok(m3, "/embed_all", {"inputs": TEXTS})
    assert len(body) == len(TEXTS)
    for row, ref in zip(body, tokens, strict=True):
        array = np.array(row)
        assert array.shape == ref.shape and float(np.abs(array - ref).max()) < ATOL


def test_bge_m3_kinds_over_http_and_from_the_cache(m3: Server, packages: dict[str, Path]) -> None:
    dense, lexical, multi, _ = bge_m3_reference(packages["xlm-roberta-bge-m3"], TEXTS)
    texts = [f"{t} repeat" for t in TEXTS]  # fresh inputs: the first request misses
    for kind in ("sparse", "multi_vector", "dense"):
        body = {"input": texts, "options": {"output": kind, "return_meta": True}}
        first, second = ok(m3, "/v1/embeddings", body), ok(m3, "/v1/embeddings", body)
        assert first["meta"]["cache"] == {"hits": 0, "misses": len(texts)}, kind
        assert second["meta"]["cache"] == {"hits": len(texts), "misses": 0}, kind
        assert first["data"] == second["data"]
    sparse = ok(m3, "/v1/embeddings", {"input": TEXTS, "options": {"output": "sparse"}})["data"]
    for item, ref in zip(sparse, lexical, strict=True):
        assert (
            _sparse_gap(
                dict(
                    zip(item["sparse_embedding"]["indices"], item["sparse_embedding"]["values"], strict=True)
                ),
                ref,
            )
            < ATOL
        )
    vectors = ok(m3, "/v1/embeddings", {"input": TEXTS, "options": {"output": "multi_vector"}})["data"]
    for item, ref in zip(vectors, multi, strict=True):
        assert float(np.abs(np.array(item["token_embeddings"]) - ref).max()) < ATOL
    plain = ok(m3, "/v1/embeddings", {"input": TEXTS})["data"]  # dense stays the default
    assert (
        max(float(np.abs(np.array(i["embedding"]) - d).max()) for i, d in zip(plain, dense, strict=True))
        < ATOL
    )


def test_models_list_the_output_kinds(splade: Server, m3: Server) -> None:
    assert splade.get("/v1/models").json()["data"][0]["outputs"] == ["sparse", "tokens"]
    assert m3.get("/v1/models").json()["data"][0]["outputs"] == ["dense", "sparse", "multi_vector", "tokens"]


def test_maxsim_rerank_over_http(m3: Server, packages: dict[str, Path]) -> None:
    query = "who lives in paris"
    _, _, multi, _ = bge_m3_reference(packages["xlm-roberta-bge-m3"], [query, *TEXTS])
    expected = [float((multi[0] @ d.T).max(axis=1).sum()) for d in multi[1:]]
    body = ok(m3, "/v1/rerank", {"query": query, "documents": TEXTS, "options": {"output": "multi_vector"}})
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert max(abs(got[i] - e) for i, e in enumerate(expected)) < ATOL
    assert [r["index"] for r in body["results"]] == sorted(range(len(TEXTS)), key=lambda i: -expected[i])


def test_a_bulk_job_gives_the_same_outputs(m3: Server) -> None:
    requests = [
        {"input": TEXTS[:2], "options": {"output": "sparse"}},
        {"input": TEXTS[2:], "options": {"output": "multi_vector"}},
    ]
    created = m3.post("/v1/jobs", {"surface": "embeddings", "requests": requests})
    assert created.status_code == 202, created.text
    status = wait_done(m3, created.json()["id"])
    assert status["status"] == "completed", status
    results = m3.get(f"/v1/jobs/{status['id']}/results").json()["data"]
    for result, request in zip(results, requests, strict=True):
        assert result["response"]["data"] == ok(m3, "/v1/embeddings", request)["data"]


def test_errors(
    splade: Server, m3: Server, module_server: Callable[..., Server], packages: dict[str, Path]
) -> None:
    # Ours: a kind the model does not give is the model's refusal (422), naming the field.
    r = splade.post("/v1/embeddings", {"input": "good", "options": {"output": "dense"}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "options.output", r.text
    r = m3.post("/v1/embeddings", {"input": "good", "options": {"output": "sparse"}, "dimensions": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions", r.text
    r = m3.post("/v1/embeddings", {"input": "good", "options": {"output": "bag"}})
    assert r.status_code == 400 and "options.output" in r.text, r.text
    # TEI's: too many inputs 413, none 400, a body that does not decode 422, a model that cannot 424.
    tei_error(splade, "/embed_sparse", {"inputs": ["a"] * 9}, 413, "validation")
    tei_error(splade, "/embed_sparse", {"inputs": []}, 400, "empty")
    tei_error(splade, "/embed_all", {"inputs": "a", "normalize": True}, 422, "validation")
    tei_error(splade, "/embed_all", {"inputs": ["word " * 300]}, 413, "validation")
    # A SPLADE model is TEI's embedding model with splade pooling, which has no /embed.
    assert splade.get("/info").json()["model_type"] == {"embedding": {"pooling": "splade"}}
    assert "no 'dense' output" in tei_error(splade, "/embed", {"inputs": "good"}, 424, "backend")
    plain = module_server(str(packages["bert-embedding"]))
    assert "gives no 'sparse' output" in tei_error(plain, "/embed_sparse", {"inputs": "good"}, 424, "backend")
    assert len(ok(plain, "/embed_all", {"inputs": ["good", "a b c"]})[1]) == 5  # [CLS] a b c [SEP]

"""A PyLate ColBERT package over HTTP: /v1/embeddings with input_type query and document, MaxSim
rerank on /v1/rerank (and TEI's /rerank), both from the result cache on repeat, and in a bulk
job; the numbers are those pylate.models.ColBERT gives, computed from Transformers by PyLate's
steps (tests/families/task_heads/colbert_references.py), at 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from families.task_heads.colbert_references import ATOL, QUERY, TEXTS, colbert_reference, maxsim, write_pylate
from helpers import Server, ok


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    return write_pylate(tmp_path_factory.mktemp("pylate") / "colbert", backbone="bert")


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], package: Path) -> Server:
    return module_server(str(package))


def _gap(data: list[dict], reference: list[np.ndarray]) -> float:
    worst = 0.0
    for item, want in zip(data, reference, strict=True):
        got = np.array(item["token_embeddings"])
        assert got.shape == want.shape
        worst = max(worst, float(np.abs(got - want).max()))
    return worst


def test_queries_and_documents_over_http_and_from_the_cache(server: Server, package: Path) -> None:
    for role in ("query", "document"):
        body = {"input": TEXTS, "input_type": role, "options": {"return_meta": True, "overflow": "truncate"}}
        first, second = ok(server, "/v1/embeddings", body), ok(server, "/v1/embeddings", body)
        assert first["meta"]["cache"] == {"hits": 0, "misses": len(TEXTS)}, role
        assert second["meta"]["cache"] == {"hits": len(TEXTS), "misses": 0}, role
        assert first["data"] == second["data"]
        assert _gap(first["data"], colbert_reference(package, TEXTS, is_query=role == "query")) < ATOL
    card = server.get("/v1/models").json()["data"][0]
    assert card["outputs"] == ["multi_vector", "tokens"]


def test_maxsim_rerank_over_http(server: Server, package: Path) -> None:
    (query,) = colbert_reference(package, [QUERY], is_query=True)
    expected = [maxsim(query, d) for d in colbert_reference(package, TEXTS, is_query=False)]
    order = sorted(range(len(TEXTS)), key=lambda i: -expected[i])
    body = {"query": QUERY, "documents": TEXTS, "options": {"return_meta": True, "overflow": "truncate"}}
    first, second = ok(server, "/v1/rerank", body), ok(server, "/v1/rerank", body)
    got = {r["index"]: r["relevance_score"] for r in first["results"]}
    assert max(abs(got[i] - e) for i, e in enumerate(expected)) < ATOL
    assert [r["index"] for r in first["results"]] == order
    assert second["meta"]["cache"] == {"hits": len(TEXTS) + 1, "misses": 0}
    # The query's vectors were cached as a query: embedding it as one is a hit.
    hit = ok(server, "/v1/embeddings", {"input": QUERY, "input_type": "query", "options": {"return_meta": True}})
    assert hit["meta"]["cache"] == {"hits": 1, "misses": 0}
    tei = ok(server, "/rerank", {"query": QUERY, "texts": TEXTS, "truncate": True})
    assert [r["index"] for r in tei] == order


def test_a_bulk_job_gives_the_same_vectors(server: Server) -> None:
    import time

    truncate = {"overflow": "truncate"}
    requests = [{"input": TEXTS[:2], "input_type": "query", "options": truncate}, {"input": TEXTS[2:], "options": truncate}]
    created = server.post("/v1/jobs", {"surface": "embeddings", "requests": requests})
    assert created.status_code == 202, created.text
    deadline = time.monotonic() + 30
    while (status := server.get(f"/v1/jobs/{created.json()['id']}").json())["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert status["status"] == "completed", status
    results = server.get(f"/v1/jobs/{status['id']}/results").json()["data"]
    for result, request in zip(results, requests, strict=True):
        assert result["response"]["data"] == ok(server, "/v1/embeddings", request)["data"]


def test_refusals_over_http(server: Server) -> None:
    r = server.post("/v1/embeddings", {"input": "good", "options": {"output": "dense"}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "options.output", r.text
    r = server.post("/v1/embeddings", {"input": [1, 2, 3]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "input", r.text
    r = server.post("/v1/embeddings", {"input": "word " * 40, "input_type": "query"})
    assert r.status_code == 400 and "a query of this model takes at most 11" in r.text, r.text


def test_cohere_embed_is_refused_for_want_of_a_dense_vector(server: Server) -> None:
    """Cohere's embed answers one vector per text, which a PyLate package does not give: the
    model's 422 naming `model` (Cohere's body has no options), never a 500."""
    for path in ("/v1/embed", "/v2/embed"):
        r = server.post(path, {"texts": ["good"]})
        assert r.status_code == 422, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == "model" and "'dense'" in error["message"], error


def test_vllm_pooling_is_refused_for_want_of_a_pooled_vector(server: Server) -> None:
    """vLLM's /pooling answers each input's pooled vector, which a PyLate package does not give:
    the model's 422 naming `model` (the body has no options), never a 500."""
    for path in ("/pooling", "/vllm/pooling"):
        r = server.post(path, {"input": "good"})
        assert r.status_code == 422, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == "model" and "'dense'" in error["message"], error

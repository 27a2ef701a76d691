"""LiteLLM's rerank providers and its OpenAI embeddings against the server, each with only the
base URL changed, every number compared with this server's own routes.

- `hosted_vllm/` at the root (or `…/vllm`, `…/vllm/v1`): vLLM's answer, documents as `{text}`.
- `infinity/` at `…/infinity`: Infinity's answer, documents as strings.
- `cohere/` at the root (Cohere v2's /v2/rerank) and `jina_ai/` (which always posts /v1/rerank).
- `litellm.embedding("openai/…")` at the root (/embeddings, TEI's and Infinity's path) and at
  `…/v1`; `litellm.embedding("hosted_vllm/…")` at the root, `…/v1`, `…/vllm` and `…/vllm/v1`.

The reranker is the tiny random-weight bert-reranker fixture, whose numbers mean nothing: each
score must equal /v1/rerank's for the same query and document (the same float through JSON,
so to 1e-12). The embedder is all-MiniLM-L6-v2: each vector must equal /v1/embeddings' to
float32's precision (the OpenAI client inside LiteLLM asks for base64 float32).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest
from helpers import Server

# LiteLLM fetches its model price map from the internet at import unless told to use its copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

MODEL = "reranker"
QUERY = "where do foxes live"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "invoices are due at the end of the month",
    "foxes live in dens in forests and grasslands",
    "a recipe for bread",
]
TEXTS = ["foxes live in dens", "a recipe for bread", "invoices are due at the end of the month"]
SAME = 1e-12  # the same float64, through JSON twice
FLOAT32 = 1e-6  # a float32 vector through base64


@pytest.fixture(scope="module")
def reranker(reranker_server: Server) -> Server:
    return reranker_server


@pytest.fixture(scope="module")
def minilm(minilm_server: Server) -> Server:
    return minilm_server


@pytest.fixture(scope="module")
def ours(reranker: Server) -> dict[int, dict[str, float]]:
    """/v1/rerank's relevance score and logit of each document, by index."""
    response = reranker.post("/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    return {r["index"]: r for r in response.json()["results"]}


def rerank(provider: str, base: str, **extra: Any) -> Any:
    return litellm.rerank(
        model=f"{provider}/{MODEL}", query=QUERY, documents=DOCUMENTS, api_base=base, api_key="x", **extra
    )


def check_ranked(answer: Any, ours: dict[int, dict[str, float]], *, documents: bool) -> None:
    results = answer.results
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    for result in results:
        assert math.isclose(result["relevance_score"], ours[result["index"]]["relevance_score"], abs_tol=SAME)
        if documents:
            assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("path", ["", "/vllm", "/vllm/v1"])
def test_hosted_vllm_rerank(reranker: Server, ours: dict[int, dict[str, float]], path: str) -> None:
    # LiteLLM asks for the documents by default and reads each as vLLM's `{text}`.
    check_ranked(rerank("hosted_vllm", reranker.url + path), ours, documents=True)
    top = rerank("hosted_vllm", reranker.url + path, top_n=2)
    assert [r["index"] for r in top.results] == [
        r["index"] for r in rerank("hosted_vllm", reranker.url).results
    ][:2]


def test_infinity_rerank(reranker: Server, ours: dict[int, dict[str, float]]) -> None:
    check_ranked(rerank("infinity", reranker.url + "/infinity"), ours, documents=True)
    top = rerank("infinity", reranker.url + "/infinity", top_n=1, return_documents=False)
    assert len(top.results) == 1 and "document" not in top.results[0]
    assert top.results[0]["index"] == max(ours, key=lambda i: ours[i]["relevance_score"])


def test_cohere_and_jina_rerank_at_the_root(reranker: Server, ours: dict[int, dict[str, float]]) -> None:
    check_ranked(rerank("cohere", reranker.url), ours, documents=True)
    check_ranked(rerank("jina_ai", reranker.url), ours, documents=True)


def test_the_root_rerank_is_vllms_and_the_prefix_infinitys(reranker: Server) -> None:
    """The two answers one body gets: why Infinity's clients take the /infinity base URL."""
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS[:2], "return_documents": True}
    at_root = reranker.post("/rerank", body).json()["results"]
    under_prefix = reranker.post("/infinity/rerank", body).json()["results"]
    assert {r["document"]["text"] for r in at_root} == set(DOCUMENTS[:2])
    assert {r["document"] for r in under_prefix} == set(DOCUMENTS[:2])
    with pytest.raises(Exception, match="valid string"):  # LiteLLM's Infinity reader on vLLM's answer
        rerank("infinity", reranker.url)


def ours_vectors(server: Server, texts: list[str]) -> np.ndarray:
    response = server.post("/v1/embeddings", {"model": "minilm", "input": texts})
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float64)


@pytest.mark.parametrize("path", ["", "/v1"])
def test_openai_embedding(minilm: Server, path: str) -> None:
    answer = litellm.embedding(model="openai/minilm", input=TEXTS, api_base=minilm.url + path, api_key="x")
    got = np.asarray([item["embedding"] for item in answer.data], dtype=np.float64)
    np.testing.assert_allclose(got, ours_vectors(minilm, TEXTS), atol=FLOAT32)
    assert [item["index"] for item in answer.data] == [0, 1, 2]
    assert answer.usage.prompt_tokens > 0


@pytest.mark.parametrize("path", ["", "/v1", "/vllm", "/vllm/v1"])
def test_hosted_vllm_embedding(minilm: Server, path: str) -> None:
    """`hosted_vllm/` embeddings post `{base}/embeddings`: every base URL its rerank takes."""
    answer = litellm.embedding(
        model="hosted_vllm/minilm", input=TEXTS, api_base=minilm.url + path, api_key="x"
    )
    got = np.asarray([item["embedding"] for item in answer.data], dtype=np.float64)
    np.testing.assert_allclose(got, ours_vectors(minilm, TEXTS), atol=FLOAT32)

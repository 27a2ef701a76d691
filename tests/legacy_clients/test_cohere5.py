"""cohere 5's clients at the server's root, as tests/compat/test_cohere.py checks cohere 7.

`Client` (Cohere's v1 API) posts rerank to `/v1/rerank`, this server's own route; `ClientV2`
posts `/v2/rerank`, the Cohere adapter. The reranker is the tiny random-weight bert-reranker
fixture, so each score is compared with /v1/rerank's for the same query and text, fetched by
plain HTTP: the same float, exactly (both are the one cached result, through JSON).
"""

from __future__ import annotations

import cohere
import pytest
from conftest import Server

MODEL = "reranker"
QUERY = "where do foxes live"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "invoices are due at the end of the month",
    "foxes live in dens in forests and grasslands",
    "a recipe for bread",
]


def ours(server: Server, documents: list[str], path: str = "/v1/rerank") -> dict[str, float]:
    """/v1/rerank's score of each text."""
    body = server.post(path, {"model": MODEL, "query": QUERY, "documents": documents})
    return {documents[r["index"]]: r["relevance_score"] for r in body["results"]}


def test_v1_client_rerank_is_v1_rerank(reranker: Server) -> None:
    client = cohere.Client(base_url=reranker.url, api_key="x", timeout=30)
    answer = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS)
    expected = ours(reranker, DOCUMENTS)
    assert sorted(r.index for r in answer.results) == list(range(len(DOCUMENTS)))
    assert {DOCUMENTS[r.index]: r.relevance_score for r in answer.results} == expected
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True)
    top = client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [(r.index, r.relevance_score) for r in top.results] == [
        (r.index, r.relevance_score) for r in answer.results[:2]
    ]


def test_v1_client_documents_are_the_contracts_strings_at_the_root_and_text_under_vllm(
    reranker: Server,
) -> None:
    """/v1/rerank keeps the upstream contract's string document; Cohere's v1 API answers
    `{text}`, which vLLM's /v1/rerank (under /vllm) gives with the same scores."""
    at_root = cohere.Client(base_url=reranker.url, api_key="x", timeout=30)
    kept = at_root.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert {r.index: r.document for r in kept.results} == dict(enumerate(DOCUMENTS))
    under_vllm = cohere.Client(base_url=f"{reranker.url}/vllm", api_key="x", timeout=30)
    answer = under_vllm.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, return_documents=True)
    expected = ours(reranker, DOCUMENTS)
    for result in answer.results:
        assert result.document is not None and result.document.text == DOCUMENTS[result.index]
        assert result.relevance_score == expected[DOCUMENTS[result.index]]


def test_v2_client_rerank_is_v1_rerank(reranker: Server) -> None:
    client = cohere.ClientV2(base_url=reranker.url, api_key="x", timeout=30)
    answer = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS)
    assert {DOCUMENTS[r.index]: r.relevance_score for r in answer.results} == ours(reranker, DOCUMENTS)
    assert answer.meta is not None and answer.meta.api_version is not None
    assert answer.meta.api_version.version == "2"
    top = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=1, max_tokens_per_doc=4000)
    assert [r.index for r in top.results] == [answer.results[0].index]


def test_bad_input_raises_the_clients_errors(reranker: Server) -> None:
    v1 = cohere.Client(base_url=reranker.url, api_key="x", timeout=30)
    v2 = cohere.ClientV2(base_url=reranker.url, api_key="x", timeout=30)
    for client in (v1, v2):
        with pytest.raises(cohere.BadRequestError):
            client.rerank(model=MODEL, query=QUERY, documents=[])
        with pytest.raises(cohere.NotFoundError):
            client.rerank(model="rerank-english-v2.0", query=QUERY, documents=DOCUMENTS)

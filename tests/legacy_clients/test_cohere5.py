"""cohere 5's clients at the server's root, as tests/compat/test_cohere.py and
test_cohere_embed.py check cohere 7.

`Client` (Cohere's v1 API) posts rerank to `/v1/rerank`, this server's own route, and embed to
`/v1/embed`; `ClientV2` posts `/v2/rerank` and `/v2/embed`, the Cohere adapters. The models are
tiny random-weight fixtures (a bert-reranker; a bert-embedding with query and document
prompts), so each score is compared with /v1/rerank's and each vector with /v1/embeddings' for
the same text, fetched by plain HTTP: the same floats, exactly (one result through JSON).
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


def vectors(server: Server, texts: list[str], **extra: object) -> list[list[float]]:
    """/v1/embeddings' vector of each text."""
    body = server.post("/v1/embeddings", {"model": "embedder", "input": texts, **extra})
    return [item["embedding"] for item in body["data"]]


def test_v1_client_embed_is_v1_embeddings(embedder: Server) -> None:
    client = cohere.Client(base_url=embedder.url, api_key="x", timeout=30)
    answer = client.embed(texts=DOCUMENTS, model="embedder")
    assert answer.response_type == "embeddings_floats" and answer.embeddings == vectors(embedder, DOCUMENTS)
    query = client.embed(texts=DOCUMENTS, model="embed-english-v3.0", input_type="search_query")
    assert query.embeddings == vectors(embedder, DOCUMENTS, input_type="query") != answer.embeddings
    by_type = client.embed(texts=DOCUMENTS, model="embedder", embedding_types=["float"])
    assert by_type.response_type == "embeddings_by_type" and by_type.embeddings.float_ == answer.embeddings


def test_v2_client_embed_is_v1_embeddings(embedder: Server) -> None:
    client = cohere.ClientV2(base_url=embedder.url, api_key="x", timeout=30)
    documents = client.embed(texts=DOCUMENTS, model="embedder", input_type="search_document")
    assert documents.embeddings.float_ == vectors(embedder, DOCUMENTS, input_type="document")
    short = client.embed(
        texts=DOCUMENTS,
        model="embedder",
        input_type="clustering",
        embedding_types=["float"],
        output_dimension=8,
    )
    assert short.embeddings.float_ == vectors(embedder, DOCUMENTS, dimensions=8)
    long = " ".join(["fox"] * 300)  # past the fixture's 128 tokens
    with pytest.raises(cohere.BadRequestError):
        client.embed(texts=[long], model="embedder", input_type="clustering", truncate="NONE")
    kept = client.embed(texts=[long], model="embedder", input_type="clustering", truncate="START")
    left = {"overflow": "truncate", "truncation_direction": "left"}
    assert kept.embeddings.float_ == vectors(embedder, [long], options=left)

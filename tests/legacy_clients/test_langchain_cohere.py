"""langchain-cohere 0.6's CohereRerank (on cohere 5's ClientV2) and CohereEmbeddings (on its
v1 Client) at the server's root.

CohereRerank posts `/v2/rerank`; each score is compared with /v1/rerank's for the same text, by
plain HTTP, exactly (the one cached result through JSON). A dict is ranked as the YAML text the
class makes of its rank fields, so that text is what /v1/rerank is asked about. CohereEmbeddings
posts `/v1/embed` with `input_type` search_document or search_query: its vectors are
/v1/embeddings' with the package's document or query prompt, exactly.
"""

from __future__ import annotations

import asyncio

import yaml
from conftest import Server
from langchain_cohere import CohereEmbeddings, CohereRerank
from langchain_core.documents import Document

QUERY = "where do foxes live"
TEXTS = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "invoices are due at the end of the month",
    "foxes live in dens in forests and grasslands",
    "a recipe for bread",
]


def ours(server: Server, documents: list[str]) -> list[tuple[int, float]]:
    """/v1/rerank's (index, score), best first."""
    body = server.post("/v1/rerank", {"model": "reranker", "query": QUERY, "documents": documents})
    return [(r["index"], r["relevance_score"]) for r in body["results"]]


def reranker_at(server: Server, **kwargs: object) -> CohereRerank:
    return CohereRerank(model="reranker", base_url=server.url, cohere_api_key="x", **kwargs)  # type: ignore[arg-type]


def test_rerank_is_v1_rerank(reranker: Server) -> None:
    answer = reranker_at(reranker, top_n=None).rerank(TEXTS, QUERY)
    assert [(r["index"], r["relevance_score"]) for r in answer] == ours(reranker, TEXTS)
    top = reranker_at(reranker).rerank(TEXTS, QUERY)  # the class's top_n, 3
    assert [(r["index"], r["relevance_score"]) for r in top] == ours(reranker, TEXTS)[:3]


def test_compress_documents_keeps_the_best_with_their_scores(reranker: Server) -> None:
    documents = [Document(page_content=text, metadata={"n": i}) for i, text in enumerate(TEXTS)]
    kept = reranker_at(reranker, top_n=2).compress_documents(documents, QUERY)
    expected = ours(reranker, TEXTS)[:2]
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in kept] == expected
    assert [d.page_content for d in kept] == [TEXTS[i] for i, _ in expected]


def test_dicts_are_ranked_as_the_yaml_of_their_rank_fields(reranker: Server) -> None:
    records = [{"title": f"note {i}", "body": text, "id": i} for i, text in enumerate(TEXTS)]
    answer = reranker_at(reranker, top_n=None).rerank(records, QUERY, rank_fields=["title", "body"])
    as_yaml = [yaml.dump({"title": r["title"], "body": r["body"]}, sort_keys=False) for r in records]
    assert [(r["index"], r["relevance_score"]) for r in answer] == ours(reranker, as_yaml)


def vectors(server: Server, texts: list[str], input_type: str) -> list[list[float]]:
    body = server.post("/v1/embeddings", {"model": "embedder", "input": texts, "input_type": input_type})
    return [item["embedding"] for item in body["data"]]


def test_embeddings_are_v1_embeddings_with_the_roles_prompt(embedder: Server) -> None:
    emb = CohereEmbeddings(model="embedder", base_url=embedder.url, cohere_api_key="x")  # type: ignore[arg-type]
    documents = emb.embed_documents(TEXTS)
    assert documents == vectors(embedder, TEXTS, "document")
    assert emb.embed_query(QUERY) == vectors(embedder, [QUERY], "query")[0]
    assert documents != vectors(embedder, TEXTS, "query")
    assert asyncio.run(emb.aembed_documents(TEXTS)) == documents
    assert asyncio.run(emb.aembed_query(QUERY)) == emb.embed_query(QUERY)

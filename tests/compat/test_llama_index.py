"""llama-index's TEI embeddings, TEI rerank and OpenAI-like embeddings through the real
packages against `vllm-srun serve`, with only the base URL given.

The numbers are checked against our own routes' answers for the same texts: vectors exactly
(the same float32 goes through JSON or base64 and back), scores exactly (the same float64 in
JSON). Embeddings are all-MiniLM-L6-v2; the reranker is the tiny random-weight bert-reranker
fixture, whose scores mean nothing but must be /rerank's and /v1/rerank's.

llama-index's own `OpenAIEmbedding(model=...)` refuses a model name OpenAI does not list
before any request; `OpenAILikeEmbedding`, or `OpenAIEmbedding(model_name=...)`, is the
workaround docs/coming-from/openai.md names, and both are tested here.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers import Server

pytest.importorskip("llama_index.core")
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.embeddings.openai import OpenAIEmbedding
from llama_index.embeddings.openai_like import OpenAILikeEmbedding
from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference as TEIRerank

MODEL = "all-MiniLM-L6-v2"
RERANKER = "reranker"
TEXTS = [
    "A man is eating food.",
    "the quick brown fox jumps over the lazy dog",
    "Ελληνικά και русский текст",
    "a",
]
QUERY = "where do foxes live"
# About 390 tokens: past the package's max_seq_length of 256, so TEI's truncate matters.
LONG = " ".join(f"sentence number {i} talks about retrieval, embeddings and search." for i in range(28))


@pytest.fixture(scope="module")
def embedder(minilm_server: Server) -> Server:
    return minilm_server


@pytest.fixture(scope="module")
def reranker(reranker_server: Server) -> Server:
    return reranker_server


def ours(server: Server, texts: list[str], **options: object) -> np.ndarray:
    """/v1/embeddings' float vectors for `texts`."""
    body: dict[str, object] = {"model": MODEL, "input": texts, "encoding_format": "float"}
    if options:
        body["options"] = options
    answer = server.post("/v1/embeddings", body)
    assert answer.status_code == 200, answer.text
    return np.asarray([d["embedding"] for d in answer.json()["data"]], dtype=np.float64)


def test_tei_embeddings_equal_v1_embeddings(embedder: Server) -> None:
    client = TextEmbeddingsInference(model_name=MODEL, base_url=embedder.url, embed_batch_size=2)
    want = ours(embedder, TEXTS)
    assert np.array_equal(np.asarray(client.get_text_embedding_batch(TEXTS)), want)  # two requests of 2
    assert np.array_equal(np.asarray(client.get_query_embedding(TEXTS[1])), want[1])
    got = asyncio.run(client.aget_text_embedding_batch(TEXTS))
    assert np.array_equal(np.asarray(got), want)


def test_tei_query_instruction_is_part_of_the_text(embedder: Server) -> None:
    client = TextEmbeddingsInference(model_name=MODEL, base_url=embedder.url, query_instruction="query:")
    got = np.asarray(client.get_query_embedding(QUERY))
    assert np.array_equal(got, ours(embedder, [f"query: {QUERY}"])[0])
    assert not np.allclose(got, ours(embedder, [QUERY])[0], atol=1e-3)


def test_tei_truncate_true_embeds_the_model_s_first_256_tokens(embedder: Server) -> None:
    """The client always sends `truncate: true`: an over-long text is cut as /v1/embeddings
    cuts it under `options.overflow: truncate`, never refused."""
    client = TextEmbeddingsInference(model_name=MODEL, base_url=embedder.url)
    got = np.asarray(client.get_text_embedding_batch(["short", LONG]))
    assert np.array_equal(got, ours(embedder, ["short", LONG], overflow="truncate"))


def test_openai_like_embeddings_equal_v1_embeddings(embedder: Server) -> None:
    client = OpenAILikeEmbedding(model_name=MODEL, api_base=f"{embedder.url}/v1", max_retries=0)
    want = ours(embedder, TEXTS)
    # The client asks for base64: the same float32, decoded by the openai client.
    assert np.array_equal(np.asarray(client.get_text_embedding_batch(TEXTS)), want)
    assert np.array_equal(np.asarray(client.get_query_embedding(TEXTS[0])), want[0])
    cut = OpenAILikeEmbedding(model_name=MODEL, api_base=f"{embedder.url}/v1", dimensions=128, max_retries=0)
    got = np.asarray(cut.get_text_embedding_batch(TEXTS))
    answer = embedder.post(
        "/v1/embeddings", {"model": MODEL, "input": TEXTS, "encoding_format": "float", "dimensions": 128}
    )
    assert got.shape == (len(TEXTS), 128)
    assert np.array_equal(got, np.asarray([d["embedding"] for d in answer.json()["data"]]))


def test_openai_embedding_refuses_the_name_client_side_and_model_name_is_the_workaround(
    embedder: Server,
) -> None:
    with pytest.raises(ValueError, match="not a valid OpenAIEmbeddingModelType"):
        OpenAIEmbedding(model=MODEL, api_base=f"{embedder.url}/v1", api_key="unused")
    client = OpenAIEmbedding(model_name=MODEL, api_base=f"{embedder.url}/v1", api_key="unused", max_retries=0)
    assert np.array_equal(np.asarray(client.get_text_embedding_batch(TEXTS)), ours(embedder, TEXTS))


def test_tei_rerank_scores_equal_rerank_and_v1_rerank(reranker: Server) -> None:
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in TEXTS]
    ranked = TEIRerank(base_url=reranker.url, top_n=3).postprocess_nodes(
        nodes, query_bundle=QueryBundle(QUERY)
    )
    tei = reranker.post("/rerank", {"query": QUERY, "texts": TEXTS}).json()
    v1 = reranker.post("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": TEXTS}).json()[
        "results"
    ]
    assert [(TEXTS.index(n.node.get_content()), n.score) for n in ranked] == [
        (r["index"], r["score"]) for r in tei[:3]
    ]
    assert [(r["index"], r["score"]) for r in tei] == [(r["index"], r["relevance_score"]) for r in v1]
    scores = [n.score for n in ranked]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3

"""haystack's TEI embedders and ranker (huggingface-api-haystack: haystack 2.x's
HuggingFaceAPITextEmbedder, HuggingFaceAPIDocumentEmbedder and HuggingFaceTEIRanker moved
there in haystack-ai 3) and its OpenAI embedders, through the real packages against
`vllm-srun serve` with only the URL given.

Numbers against our own routes' answers for the same texts: vectors exactly (the same float32
through JSON or base64 and back), scores exactly (the same float64 in JSON). Embeddings are
all-MiniLM-L6-v2; the reranker is the tiny random-weight bert-reranker fixture, the sparse
embedders' model the tiny random-weight bert-splade fixture (a BertForMaskedLM read as SPLADE).

The TEI embedders send `normalize: false` unless told otherwise: for MiniLM that is the pooled
vector before the package's Normalize module, as TEI answers it (`options.normalize: false`
on /v1/embeddings).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from helpers import Server

from vllm_srun.testing.task_heads_fixtures import write_fixture

pytest.importorskip("haystack_integrations.components.embedders.huggingface_api")
from haystack import Document
from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
from haystack.utils import Secret
from haystack_integrations.components.embedders.huggingface_api import (
    HuggingFaceAPIDocumentEmbedder,
    HuggingFaceAPITextEmbedder,
    HuggingFaceTEISparseDocumentEmbedder,
    HuggingFaceTEISparseTextEmbedder,
)
from haystack_integrations.components.rankers.huggingface_api import (
    HuggingFaceTEIRanker,
    TruncationDirection,
)

MODEL = "all-MiniLM-L6-v2"
RERANKER = "reranker"
TEXTS = [
    "A man is eating food.",
    "the quick brown fox jumps over the lazy dog",
    "Ελληνικά και русский текст",
    "a",
]
QUERY = "where do foxes live"
TEI = "text_embeddings_inference"
KEY = Secret.from_token("unused")


@pytest.fixture(scope="module")
def embedder(minilm_server: Server) -> Server:
    return minilm_server


@pytest.fixture(scope="module")
def reranker(reranker_server: Server) -> Server:
    return reranker_server


@pytest.fixture(scope="module")
def splade(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    package = write_fixture(tmp_path_factory.mktemp("haystack") / "splade", variant="bert-splade")
    return module_server(str(package), "--served-model-name", "splade")


def ours(server: Server, texts: list[str], **extra: object) -> np.ndarray:
    """/v1/embeddings' float vectors for `texts` (extra: top-level fields, e.g. options)."""
    body: dict[str, object] = {"model": MODEL, "input": texts, "encoding_format": "float", **extra}
    answer = server.post("/v1/embeddings", body)
    assert answer.status_code == 200, answer.text
    return np.asarray([d["embedding"] for d in answer.json()["data"]], dtype=np.float64)


def test_tei_text_embedder_equals_v1_embeddings(embedder: Server) -> None:
    plain = HuggingFaceAPITextEmbedder(api_type=TEI, api_params={"url": embedder.url}, token=None)
    got = np.asarray(plain.run(TEXTS[1])["embedding"])
    want = ours(embedder, [TEXTS[1]], options={"normalize": False})[0]
    assert np.array_equal(got, want)
    assert abs(float(np.linalg.norm(got)) - 1.0) > 1e-3  # not normalised: the client's default
    normalised = HuggingFaceAPITextEmbedder(
        api_type=TEI, api_params={"url": embedder.url}, token=None, normalize=True, prefix="query: "
    )
    got = np.asarray(normalised.run(QUERY)["embedding"])
    assert np.array_equal(got, ours(embedder, [f"query: {QUERY}"])[0])


def test_tei_document_embedder_equals_v1_embeddings(embedder: Server) -> None:
    client = HuggingFaceAPIDocumentEmbedder(
        api_type=TEI,
        api_params={"url": embedder.url},
        token=None,
        normalize=True,
        batch_size=3,  # two requests: 3 texts, then 1
        meta_fields_to_embed=["title"],
        progress_bar=False,
    )
    documents = [Document(content=t, meta={"title": f"T{i}"}) for i, t in enumerate(TEXTS)]
    got = np.asarray([d.embedding for d in client.run(documents)["documents"]])
    assert np.array_equal(got, ours(embedder, [f"T{i}\n{t}" for i, t in enumerate(TEXTS)]))


def test_openai_embedders_with_api_base_url_equal_v1_embeddings(embedder: Server) -> None:
    base = f"{embedder.url}/v1"
    want = ours(embedder, TEXTS)
    text = OpenAITextEmbedder(api_key=KEY, model=MODEL, api_base_url=base, max_retries=0)
    answer = text.run(TEXTS[0])
    assert np.array_equal(np.asarray(answer["embedding"]), want[0])
    assert answer["meta"]["model"] == MODEL and answer["meta"]["usage"]["prompt_tokens"] > 0
    documents = OpenAIDocumentEmbedder(
        api_key=KEY, model=MODEL, api_base_url=base, batch_size=2, progress_bar=False, max_retries=0
    )
    got = documents.run([Document(content=t) for t in TEXTS])["documents"]
    assert np.array_equal(np.asarray([d.embedding for d in got]), want)
    cut = OpenAITextEmbedder(api_key=KEY, model=MODEL, api_base_url=base, dimensions=128, max_retries=0)
    got_cut = np.asarray(cut.run(TEXTS[0])["embedding"])
    assert got_cut.shape == (128,) and np.array_equal(got_cut, ours(embedder, TEXTS[:1], dimensions=128)[0])


def test_tei_ranker_scores_equal_rerank_and_v1_rerank(reranker: Server) -> None:
    documents = [Document(content=t) for t in TEXTS]
    ranked = HuggingFaceTEIRanker(url=reranker.url, top_k=3, token=None).run(query=QUERY, documents=documents)
    v1 = reranker.post("/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": TEXTS}).json()[
        "results"
    ]
    assert [(TEXTS.index(d.content or ""), d.score) for d in ranked["documents"]] == [
        (r["index"], r["relevance_score"]) for r in v1[:3]
    ]
    raw = HuggingFaceTEIRanker(url=reranker.url, raw_scores=True, token=None).run(
        query=QUERY, documents=documents
    )
    assert [(TEXTS.index(d.content or ""), d.score) for d in raw["documents"]] == [
        (r["index"], r["logit"]) for r in v1
    ]


def test_tei_ranker_truncation_direction_is_tei_s(reranker: Server) -> None:
    """`truncation_direction` sends TEI's `truncate: true` with the side to cut: a document
    past the model's limit is ranked on its first (Right) or last (Left) tokens."""
    long_text = " ".join(["foxes live in dens"] * 20 + ["invoices are due monthly"] * 20 + ["end"])
    limit = reranker.get("/info").json()["max_input_length"]
    assert len(reranker.post("/tokenize", {"inputs": long_text}).json()[0]) > limit
    documents = [Document(content=long_text), Document(content=TEXTS[1])]
    ranker = HuggingFaceTEIRanker(url=reranker.url, token=None)
    scores = {}
    for side in (TruncationDirection.LEFT, TruncationDirection.RIGHT):
        answer = ranker.run(query=QUERY, documents=documents, truncation_direction=side)["documents"]
        tei = reranker.post(
            "/rerank",
            {
                "query": QUERY,
                "texts": [long_text, TEXTS[1]],
                "truncate": True,
                "truncation_direction": side.value,
            },
        ).json()
        by_text = {d.content: d.score for d in answer}
        assert {[long_text, TEXTS[1]][r["index"]]: r["score"] for r in tei} == by_text
        scores[side] = by_text[long_text]
    assert scores[TruncationDirection.LEFT] != scores[TruncationDirection.RIGHT]


def ours_sparse(server: Server, texts: list[str]) -> list[tuple[list[int], list[float]]]:
    """/v1/embeddings' sparse embeddings (`options.output: sparse`) of `texts`."""
    body = {"model": "splade", "input": texts, "options": {"output": "sparse"}}
    answer = server.post("/v1/embeddings", body)
    assert answer.status_code == 200, answer.text
    return [
        (d["sparse_embedding"]["indices"], d["sparse_embedding"]["values"]) for d in answer.json()["data"]
    ]


def test_tei_sparse_embedders_equal_v1_embeddings_sparse(splade: Server) -> None:
    """The sparse embedders post `{inputs}` to TEI's /embed_sparse: the same ids, ascending,
    and the same float32 weights as /v1/embeddings' sparse output."""
    want = ours_sparse(splade, TEXTS)
    assert all(len(indices) > 0 for indices, _ in want)
    text = HuggingFaceTEISparseTextEmbedder(api_base_url=splade.url, token=None)
    got = text.run(TEXTS[1])["sparse_embedding"]
    assert (got.indices, got.values) == want[1]
    documents = HuggingFaceTEISparseDocumentEmbedder(
        api_base_url=splade.url, token=None, batch_size=3, progress_bar=False
    )
    embedded = documents.run([Document(content=t) for t in TEXTS])["documents"]
    assert [(d.sparse_embedding.indices, d.sparse_embedding.values) for d in embedded] == want

"""The real `infinity_client` (Infinity's generated client) against the server at
`…/infinity`: embeddings, rerank, classify (with and without `raw_scores`), models and health,
every number compared with this server's own routes.

The embedder is all-MiniLM-L6-v2 (also a bi-encoder reranker), the cross-encoder the tiny
random-weight bert-reranker fixture and the classifier the three-label bert-sequence fixture:
each score must equal /v1/rerank's or /v1/classify's for the same text (the same float through
JSON, so to 1e-12), each vector /v1/embeddings'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import Server

from vllm_srun.testing.task_heads_fixtures import write_fixture

pytest.importorskip("infinity_client")
from infinity_client import Client
from infinity_client.api.default import classify, embeddings, health, models, rerank
from infinity_client.models import (
    ClassifyInput,
    ClassifyResult,
    OpenAIEmbeddingInputText,
    OpenAIEmbeddingResult,
    OpenAIModelInfo,
    RerankInput,
    ReRankResult,
)

QUERY = "where do foxes live"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "invoices are due at the end of the month",
    "foxes live in dens in forests and grasslands",
]
SAME = 1e-12
MINILM = "all-MiniLM-L6-v2"  # the shared server's first name for it (tests/conftest.py)


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("infinity-client")
    return {
        "sequence": write_fixture(root / "sequence", variant="bert-sequence"),
    }


@pytest.fixture(scope="module")
def minilm(minilm_server: Server) -> Server:
    return minilm_server


@pytest.fixture(scope="module")
def reranker(reranker_server: Server) -> Server:
    return reranker_server


@pytest.fixture(scope="module")
def classifier(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["sequence"]), "--served-model-name", "sentiment")


def client(server: Server) -> Client:
    return Client(base_url=server.url + "/infinity", timeout=30.0, raise_on_unexpected_status=True)


def test_embeddings_equal_v1_embeddings(minilm: Server) -> None:
    texts = ["foxes live in dens", "a recipe for bread"]
    answer = embeddings.sync(client=client(minilm), body=OpenAIEmbeddingInputText(input_=texts))
    assert isinstance(answer, OpenAIEmbeddingResult), answer
    ours = minilm.post("/v1/embeddings", {"model": MINILM, "input": texts}).json()
    got = np.asarray([item.embedding for item in answer.data])
    np.testing.assert_allclose(got, [item["embedding"] for item in ours["data"]], atol=SAME)
    assert answer.model == MINILM and answer.usage.prompt_tokens == ours["usage"]["prompt_tokens"]
    # The client sends `dimensions: 0` and `modality: "text"` unless told otherwise; a dimension
    # given is MiniLM's Matryoshka-free truncation, as /v1/embeddings gives it.
    short = embeddings.sync(client=client(minilm), body=OpenAIEmbeddingInputText(input_=texts, dimensions=8))
    assert isinstance(short, OpenAIEmbeddingResult), short
    cut = minilm.post("/v1/embeddings", {"model": MINILM, "input": texts, "dimensions": 8}).json()
    np.testing.assert_allclose(
        [i.embedding for i in short.data], [i["embedding"] for i in cut["data"]], atol=SAME
    )


def ours_rerank(server: Server, model: str) -> dict[int, dict[str, float]]:
    response = server.post("/v1/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    return {r["index"]: r for r in response.json()["results"]}


@pytest.mark.parametrize("which", ["reranker", "minilm"])
def test_rerank_equals_v1_rerank(which: str, request: pytest.FixtureRequest) -> None:
    server: Server = request.getfixturevalue(which)
    expected = ours_rerank(server, which)
    body = RerankInput(query=QUERY, documents=DOCUMENTS, return_documents=True)
    answer = rerank.sync(client=client(server), body=body)
    assert isinstance(answer, ReRankResult), answer
    assert sorted(r.index for r in answer.results) == [0, 1, 2]
    for result in answer.results:
        assert math.isclose(result.relevance_score, expected[result.index]["relevance_score"], abs_tol=SAME)
        assert result.document == DOCUMENTS[result.index]  # Infinity's string, not vLLM's {text}
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True)
    raw = rerank.sync(
        client=client(server), body=RerankInput(query=QUERY, documents=DOCUMENTS, raw_scores=True, top_n=2)
    )
    assert isinstance(raw, ReRankResult) and len(raw.results) == 2
    for result in raw.results:
        assert math.isclose(result.relevance_score, expected[result.index]["logit"], abs_tol=SAME)
        assert result.document is None


def test_classify_equals_v1_classify(classifier: Server) -> None:
    texts = ["what a lovely day", "this is terrible"]
    ours = classifier.post(
        "/v1/classify", {"model": "sentiment", "input": texts, "options": {"return_logits": True}}
    ).json()
    labels = ours["labels"]
    for raw, field in ((False, "probabilities"), (True, "logits")):
        answer = classify.sync(client=client(classifier), body=ClassifyInput(input_=texts, raw_scores=raw))
        assert isinstance(answer, ClassifyResult), answer
        assert len(answer.data) == len(texts) and answer.model == "sentiment"
        for row, result in zip(answer.data, ours["results"], strict=True):
            expected = dict(zip(labels, result[field], strict=True))
            assert {o.label for o in row} == set(labels)
            for item in row:
                assert math.isclose(item.score, expected[item.label], abs_tol=SAME)
            assert [o.score for o in row] == sorted((o.score for o in row), reverse=True)


def test_models_and_health(minilm: Server, classifier: Server) -> None:
    listed = models.sync(client=client(minilm))
    assert isinstance(listed, OpenAIModelInfo), listed
    [card] = listed.data
    assert card.id == MINILM and set(card.capabilities) == {"embed", "rerank"}
    [card] = models.sync(client=client(classifier)).data  # type: ignore[union-attr]
    assert card.id == "sentiment" and card.capabilities == ["classify"]
    alive = health.sync(client=client(minilm))
    assert alive is not None and alive["unix"] > 0

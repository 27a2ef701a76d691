"""Cohere's v2 rerank through the real `cohere` client (ClientV2) against a served reranker.

The reranker is the tiny random-weight bert-reranker fixture: its numbers mean nothing, so
every score is checked against what /v1/rerank answers for the same query and text.
"""

from __future__ import annotations

import math
from pathlib import Path

import cohere
import httpx
import pytest
from helpers import Server
from tokenizers import Tokenizer

MODEL = "reranker"
QUERY = "where do foxes live"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog near the river bank",
    "invoices are due at the end of the month",
    "foxes live in dens in forests and grasslands",
    "a recipe for bread",
]
# The same float32 logit, maybe from a batch of another shape (a few float32 ulps of a logit of
# a few units), through a sigmoid whose slope is at most 1/4.
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def package(reranker_package: Path) -> Path:
    return reranker_package


@pytest.fixture(scope="module")
def server(reranker_server: Server) -> Server:
    return reranker_server


@pytest.fixture(scope="module")
def client(server: Server) -> cohere.ClientV2:
    return cohere.ClientV2(base_url=server.url, api_key="x", timeout=30)


def ours(server: Server, documents: list[str]) -> dict[str, float]:
    """/v1/rerank's score of each text."""
    body = server.post("/v1/rerank", {"model": MODEL, "query": QUERY, "documents": documents})
    assert body.status_code == 200, body.text
    return {documents[r["index"]]: r["relevance_score"] for r in body.json()["results"]}


def test_scores_and_order_equal_v1_rerank(client: cohere.ClientV2, server: Server) -> None:
    answer = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS)
    expected = ours(server, DOCUMENTS)
    assert sorted(r.index for r in answer.results) == list(range(len(DOCUMENTS)))
    for result in answer.results:
        assert math.isclose(result.relevance_score, expected[DOCUMENTS[result.index]], abs_tol=TOLERANCE)
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True)
    assert answer.id and answer.meta is not None and answer.meta.api_version is not None
    assert answer.meta.api_version.version == "2"
    assert answer.meta.billed_units is not None and answer.meta.billed_units.search_units == 1
    # top_n keeps the best n, in the same order; an alias reaches the same model.
    top = client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [(r.index, r.relevance_score) for r in top.results] == [
        (r.index, r.relevance_score) for r in answer.results[:2]
    ]


def test_a_titled_document_is_ranked_as_cohere_s_yaml(client: cohere.ClientV2, server: Server) -> None:
    titled = {"title": "Foxes", "text": DOCUMENTS[2]}
    # The client types documents as strings but sends what it is given.
    answer = client.rerank(model=MODEL, query=QUERY, documents=[titled, DOCUMENTS[1]])  # type: ignore[list-item]
    as_yaml = f"title: Foxes\ntext: {DOCUMENTS[2]}"
    expected = ours(server, [as_yaml, DOCUMENTS[1], DOCUMENTS[2]])
    by_index = {r.index: r.relevance_score for r in answer.results}
    assert math.isclose(by_index[0], expected[as_yaml], abs_tol=TOLERANCE)
    assert not math.isclose(by_index[0], expected[DOCUMENTS[2]], abs_tol=TOLERANCE)  # the title counts
    assert math.isclose(by_index[1], expected[DOCUMENTS[1]], abs_tol=TOLERANCE)
    # Documents come back as sent when asked for (older clients send return_documents).
    raw = httpx.post(
        f"{server.url}/v2/rerank",
        json={"model": MODEL, "query": QUERY, "documents": [titled, "plain"], "return_documents": True},
        timeout=30,
    ).json()
    documents = {r["index"]: r["document"] for r in raw["results"]}
    assert documents == {0: titled, 1: {"text": "plain"}}


def test_max_tokens_per_doc_ranks_the_document_s_first_tokens(
    client: cohere.ClientV2, server: Server, package: Path
) -> None:
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    text = DOCUMENTS[0]
    encoding = tokenizer.encode(text, add_special_tokens=False)
    assert len(encoding.ids) > 7
    cut = text[: encoding.offsets[6][1]]  # the text of its first seven tokens
    short = "the fox"
    assert len(tokenizer.encode(short, add_special_tokens=False).ids) <= 7
    answer = client.rerank(model=MODEL, query=QUERY, documents=[text, short], max_tokens_per_doc=7)
    expected = ours(server, [cut, text, short])
    by_index = {r.index: r.relevance_score for r in answer.results}
    assert math.isclose(by_index[0], expected[cut], abs_tol=TOLERANCE)
    assert not math.isclose(by_index[0], expected[text], abs_tol=TOLERANCE)
    assert math.isclose(by_index[1], expected[short], abs_tol=TOLERANCE)  # short enough: whole


def test_bad_input_raises_the_client_s_errors(client: cohere.ClientV2) -> None:
    with pytest.raises(cohere.BadRequestError):
        client.rerank(model=MODEL, query=QUERY, documents=[])
    with pytest.raises(cohere.BadRequestError):
        client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=0)
    with pytest.raises(cohere.BadRequestError):
        client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, max_tokens_per_doc=0)
    with pytest.raises(cohere.BadRequestError):  # spans come from Cohere's own models
        client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, relevant_spans={"mode": "enabled"})
    with pytest.raises(cohere.BadRequestError):
        client.rerank(model=MODEL, query=QUERY, documents=[{"text": "x", "tags": "y"}])  # type: ignore[list-item]
    # Accepted and without effect here.
    assert client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, priority=1).results
    with pytest.raises(cohere.NotFoundError):
        client.rerank(model="rerank-english-v2.0", query=QUERY, documents=DOCUMENTS)


def test_scores_equal_sentence_transformers_cross_encoder(client: cohere.ClientV2, package: Path) -> None:
    """The reference a user compares against: sentence-transformers' CrossEncoder on the same
    package (sigmoid of the one-label logit), within 1e-4."""
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(package), device="cpu")
    want = reference.predict([(QUERY, d) for d in DOCUMENTS])
    answer = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS)
    for result in answer.results:
        assert math.isclose(result.relevance_score, float(want[result.index]), abs_tol=1e-4), (
            result.index,
            result.relevance_score,
            float(want[result.index]),
        )

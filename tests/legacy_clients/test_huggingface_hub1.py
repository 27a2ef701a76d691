"""huggingface_hub 1's `InferenceClient(base_url=...)` against TEI's routes, as
tests/compat/test_tei.py and test_peer_routes.py check huggingface_hub 2.

The client posts each task to the base URL itself (`POST /`), which answers by the model's kind.
Its numbers are compared with the server's own routes over plain HTTP: the route it posts to
gives the same floats (exact: the same JSON read into float32), and so does /v1/embeddings for
MiniLM's vectors; truncated vectors normalised again, cosines and class scores are the
surfaces' within 1e-6 (float32 values computed again here).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Server
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

TEXTS = ["A man is eating food.", "The new movie is awesome", "Das ist ein Beispielsatz."]
SOURCE = "where do foxes live"
SENTENCES = ["foxes live in dens", "a recipe for bread", "where do foxes live"]
FLOAT32 = 1e-6


def surface_vectors(server: Server, texts: list[str], **extra: object) -> np.ndarray:
    body = server.post("/v1/embeddings", {"input": texts, **extra})
    return np.asarray([item["embedding"] for item in body["data"]], dtype=np.float64)


def test_feature_extraction_is_the_embeddings_surface(minilm: Server) -> None:
    client = InferenceClient(base_url=minilm.url)
    vectors = client.feature_extraction(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 384)
    assert np.array_equal(vectors, np.asarray(minilm.post("/", {"inputs": TEXTS}), dtype=np.float32))
    # MiniLM's vectors are unit already: TEI's normalize leaves them as /v1/embeddings gives them.
    assert np.array_equal(vectors, surface_vectors(minilm, TEXTS).astype(np.float32))
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (1, 384) and np.array_equal(one[0], vectors[0])


def test_feature_extraction_passes_teis_options(minilm: Server) -> None:
    client = InferenceClient(base_url=minilm.url)
    raw = client.feature_extraction(TEXTS, normalize=False)
    expected = minilm.post("/embed", {"inputs": TEXTS, "normalize": False})
    assert np.array_equal(raw, np.asarray(expected, dtype=np.float32))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)  # before the Normalize module
    short = client.feature_extraction(TEXTS, dimensions=8)
    assert np.array_equal(
        short, np.asarray(minilm.post("/embed", {"inputs": TEXTS, "dimensions": 8}), dtype=np.float32)
    )
    cut = surface_vectors(minilm, TEXTS, dimensions=8)
    np.testing.assert_allclose(short, cut / np.linalg.norm(cut, axis=1, keepdims=True), atol=FLOAT32)


def test_feature_extraction_truncates_when_told_and_is_refused_otherwise(minilm: Server) -> None:
    client = InferenceClient(base_url=minilm.url)
    long = "retrieval " * 400  # past MiniLM's 256 tokens; this server has no --auto-truncate
    with pytest.raises(HfHubHTTPError) as refused:
        client.feature_extraction(long)
    assert refused.value.response is not None and refused.value.response.status_code == 413
    assert "truncate: true" in refused.value.response.json()["error"]
    for direction in ("left", "right"):
        body = {"inputs": long, "truncate": True, "truncation_direction": direction}
        got = client.feature_extraction(long, truncate=True, truncation_direction=direction)
        assert np.array_equal(got, np.asarray(minilm.post("/embed", body), dtype=np.float32))


def test_sentence_similarity_is_the_cosine_of_the_surface_vectors(minilm: Server) -> None:
    got = InferenceClient(base_url=minilm.url).sentence_similarity(SOURCE, other_sentences=SENTENCES)
    body = {"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}}
    assert got == minilm.post("/similarity", body)
    every = surface_vectors(minilm, [SOURCE, *SENTENCES])
    cosines = every[1:] @ every[0] / (np.linalg.norm(every[1:], axis=1) * np.linalg.norm(every[0]))
    np.testing.assert_allclose(got, cosines, atol=FLOAT32)
    assert abs(got[2] - 1.0) < FLOAT32


def test_text_classification_is_the_classify_surface(classifier: Server) -> None:
    client = InferenceClient(base_url=classifier.url)
    text = "the quick brown fox jumps over the lazy dog"
    surface = classifier.post("/v1/classify", {"input": text, "options": {"return_logits": True}})
    [result] = surface["results"]
    best_first = sorted(zip(result["probabilities"], surface["labels"], strict=True), reverse=True)
    answered = client.text_classification(text)
    assert [e.label for e in answered] == [label for _, label in best_first]
    np.testing.assert_allclose([e.score for e in answered], [p for p, _ in best_first], atol=FLOAT32)
    top = client.text_classification(text, top_k=1)
    assert [(e.label, e.score) for e in top] == [(answered[0].label, answered[0].score)]
    logits = dict(zip(surface["labels"], result["logits"], strict=True))
    raw = client.text_classification(text, function_to_apply="none")
    assert [e.score for e in raw] == sorted((e.score for e in raw), reverse=True)
    np.testing.assert_allclose([e.score for e in raw], [logits[e.label] for e in raw], atol=FLOAT32)

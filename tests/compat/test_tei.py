"""text-embeddings-inference's routes on the same server and models, over real HTTP.

Each TEI route is an adapter onto a surface, so its numbers must be the surface's: /embed
equals /v1/embeddings, /rerank equals /v1/rerank, /predict equals /v1/classify. /tokenize and
/decode are checked against the package's own tokenizer.json through the tokenizers library,
`huggingface_hub.InferenceClient(base_url=...)` against the routes it posts to, and MiniLM's
vectors against sentence-transformers (cosine >= 0.99999). Errors come in TEI's shape
`{error, error_type}` with TEI's status codes.

One server per model, as TEI serves one model: an embedding fixture whose package leaves out
the Normalize module (so `normalize` changes the answer), a one-label reranker, a three-label
sequence classifier, and all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import Server, minilm_dir, ok, tei_error
from tokenizers import Tokenizer

from vllm_srun.testing.task_heads_fixtures import write_fixture

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a"]
QUERY = "where does the fox sleep"
CLOSE = 1e-5  # float32 vectors and scores that went through JSON twice


PROMPTS = {"query": "query: ", "passage": "passage: "}


def _without_normalize(package: Path) -> Path:
    """The package without its Normalize module, and with sentence-transformers prompts."""
    modules = json.loads((package / "modules.json").read_text())
    kept = [m for m in modules if not m["type"].endswith(".Normalize")]
    (package / "modules.json").write_text(json.dumps(kept))
    (package / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return package


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tei-packages")
    return {
        "embedding": _without_normalize(write_fixture(root / "embed", variant="bert-embedding")),
        "reranker": write_fixture(root / "rerank", variant="bert-reranker"),
        "sequence": write_fixture(root / "sequence", variant="bert-sequence"),
    }


@pytest.fixture(scope="module")
def embedder(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["embedding"]), "--max-inputs", "8")


@pytest.fixture(scope="module")
def reranker(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["reranker"]))


@pytest.fixture(scope="module")
def classifier(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["sequence"]))


@pytest.fixture(scope="module")
def minilm(module_server: Callable[..., Server]) -> Server:
    return module_server(str(minilm_dir()), "--auto-truncate")


def _unit(vectors: Any) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float64)
    out: np.ndarray = v / np.linalg.norm(v, axis=-1, keepdims=True)
    return out


def openai_vectors(server: Server, texts: list[str], **extra: Any) -> np.ndarray:
    body = ok(server, "/v1/embeddings", {"input": texts, **extra})
    return np.asarray([item["embedding"] for item in body["data"]], dtype=np.float64)


# -- /embed -----------------------------------------------------------------------------------


def test_embed_answers_the_embeddings_surface_normalised_or_not(embedder: Server) -> None:
    surface = openai_vectors(embedder, TEXTS)
    assert not np.allclose(np.linalg.norm(surface, axis=1), 1.0), "the package must not normalise"
    raw = np.asarray(ok(embedder, "/embed", {"inputs": TEXTS, "normalize": False}))
    np.testing.assert_allclose(raw, surface, atol=CLOSE)
    unit = np.asarray(ok(embedder, "/embed", {"inputs": TEXTS}))  # normalize defaults to true
    np.testing.assert_allclose(unit, _unit(surface), atol=CLOSE)
    single = ok(embedder, "/embed", {"inputs": TEXTS[0], "normalize": False})
    assert isinstance(single, list) and len(single) == 1
    np.testing.assert_allclose(single[0], surface[0], atol=CLOSE)


def test_embed_dimensions_truncate_then_normalise(embedder: Server) -> None:
    short = openai_vectors(embedder, TEXTS, dimensions=8)
    assert short.shape == (len(TEXTS), 8)
    np.testing.assert_allclose(
        ok(embedder, "/embed", {"inputs": TEXTS, "dimensions": 8, "normalize": False}), short, atol=CLOSE
    )
    np.testing.assert_allclose(
        ok(embedder, "/embed", {"inputs": TEXTS, "dimensions": 8}), _unit(short), atol=CLOSE
    )


def test_embed_takes_prompt_names_and_token_ids_as_v1_embeddings_does(embedder: Server) -> None:
    for name in PROMPTS:
        expected = openai_vectors(embedder, TEXTS, prompt_name=name)
        body = {"inputs": TEXTS, "prompt_name": name, "normalize": False}
        np.testing.assert_allclose(ok(embedder, "/embed", body), expected, atol=CLOSE)
    assert not np.allclose(
        openai_vectors(embedder, TEXTS, prompt_name="query"), openai_vectors(embedder, TEXTS)
    )
    # A prompt the package lacks: the model's refusal, TEI's 424.
    assert "'query'" in tei_error(embedder, "/embed", {"inputs": "a", "prompt_name": "nope"}, 424, "backend")
    ids = [[t["id"] for t in tokens] for tokens in ok(embedder, "/tokenize", {"inputs": TEXTS[:2]})]
    np.testing.assert_allclose(
        ok(embedder, "/embed", {"inputs": ids, "normalize": False}), openai_vectors(embedder, ids), atol=CLOSE
    )
    np.testing.assert_allclose(
        ok(embedder, "/embed", {"inputs": ids[0], "normalize": False}),
        openai_vectors(embedder, [ids[0]]),
        atol=CLOSE,
    )


def _one_token_words(package: Path, count: int) -> list[str]:
    """Words the package's tokenizer reads as one token each, so n words are n tokens."""
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    tokenizer.no_truncation()
    words = []
    for word in sorted(tokenizer.get_vocab()):
        if word.isalpha() and word.islower() and len(word) > 2:
            if tokenizer.encode(word, add_special_tokens=False).tokens == [word]:
                words.append(word)
    assert len(words) >= 20, words
    return [words[i % len(words)] for i in range(count)]


def test_left_truncation_keeps_the_end_of_the_text(embedder: Server, packages: dict[str, Path]) -> None:
    info = embedder.get("/info").json()
    room = info["max_input_length"] - 2  # [CLS] and [SEP]
    words = _one_token_words(packages["embedding"], room + 40)
    text = " ".join(words)
    head, tail = " ".join(words[:room]), " ".join(words[-room:])
    body = {"inputs": [text], "truncate": True, "normalize": False}
    left = ok(embedder, "/embed", {**body, "truncation_direction": "Left"})
    right = ok(embedder, "/embed", {**body, "truncation_direction": "Right"})
    np.testing.assert_allclose(left, openai_vectors(embedder, [tail]), atol=CLOSE)
    np.testing.assert_allclose(right, openai_vectors(embedder, [head]), atol=CLOSE)
    # huggingface_hub writes the direction in lower case.
    assert ok(embedder, "/embed", {**body, "truncation_direction": "left"}) == left


def test_an_input_over_the_limit_is_teis_validation_error(
    embedder: Server, packages: dict[str, Path]
) -> None:
    text = " ".join(_one_token_words(packages["embedding"], 400))
    message = tei_error(embedder, "/embed", {"inputs": ["short", text], "truncate": False}, 413, "validation")
    assert "inputs[1]" in message
    # The way out in TEI's words (its body's field), not this app's options.
    assert "(send truncate: true)" in message and "options.overflow" not in message
    # Without `truncate` the server's default holds: no --auto-truncate here, so the same.
    tei_error(embedder, "/embed", {"inputs": ["short", text]}, 413, "validation")


# -- /rerank, /predict ---------------------------------------------------------------------------


def test_rerank_answers_the_rerank_surface_in_teis_order(reranker: Server) -> None:
    surface = ok(reranker, "/v1/rerank", {"query": QUERY, "documents": TEXTS})["results"]
    ranks = ok(reranker, "/rerank", {"query": QUERY, "texts": TEXTS})
    assert [r["index"] for r in ranks] == [r["index"] for r in surface]
    assert all(set(r) == {"index", "score"} for r in ranks)
    scores = [r["score"] for r in ranks]
    assert scores == sorted(scores, reverse=True)
    np.testing.assert_allclose(scores, [r["relevance_score"] for r in surface], atol=CLOSE)
    raw = ok(reranker, "/rerank", {"query": QUERY, "texts": TEXTS, "raw_scores": True, "return_text": True})
    np.testing.assert_allclose([r["score"] for r in raw], [r["logit"] for r in surface], atol=CLOSE)
    assert [r["text"] for r in raw] == [TEXTS[r["index"]] for r in raw]


def test_predict_answers_the_classify_surface_in_teis_shape(classifier: Server) -> None:
    surface = ok(classifier, "/v1/classify", {"input": [{"text": TEXTS[0]}, {"text": "a", "text_pair": "b"}]})
    labels = surface["labels"]
    expected = [
        sorted(zip(result["probabilities"], labels, strict=True), reverse=True)
        for result in surface["results"]
    ]
    single = ok(classifier, "/predict", {"inputs": TEXTS[0]})
    assert [p["label"] for p in single] == [label for _, label in expected[0]]
    np.testing.assert_allclose([p["score"] for p in single], [s for s, _ in expected[0]], atol=CLOSE)
    pair = ok(classifier, "/predict", {"inputs": ["a", "b"]})
    assert [p["label"] for p in pair] == [label for _, label in expected[1]]
    batch = ok(classifier, "/predict", {"inputs": [[TEXTS[0]], ["a", "b"]]})
    assert batch == [single, pair]


def test_predict_raw_scores_are_the_heads_logits(classifier: Server, packages: dict[str, Path]) -> None:
    """TEI's raw_scores on a softmax head: the logits, as Transformers computes them (and whose
    softmax is the surface's probabilities)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    [raw] = ok(classifier, "/predict", {"inputs": [[TEXTS[0]]], "raw_scores": True})
    surface = ok(classifier, "/v1/classify", {"input": TEXTS[0], "options": {"return_logits": True}})
    result = surface["results"][0]
    logits = np.asarray(result["logits"])
    np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(), result["probabilities"], atol=1e-6)
    by_label = dict(zip(surface["labels"], logits, strict=True))
    assert [p["score"] for p in raw] == sorted((p["score"] for p in raw), reverse=True)
    np.testing.assert_allclose([p["score"] for p in raw], [by_label[p["label"]] for p in raw], atol=CLOSE)
    tokenizer = Tokenizer.from_file(str(packages["sequence"] / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = torch.tensor([tokenizer.encode(TEXTS[0]).ids])
    reference = AutoModelForSequenceClassification.from_pretrained(str(packages["sequence"])).eval()
    with torch.no_grad():
        want = reference(input_ids=ids).logits[0].numpy()
    np.testing.assert_allclose(logits, want, atol=1e-4)


def test_predict_on_a_reranker_gives_its_sigmoid_or_its_logit(reranker: Server) -> None:
    surface = ok(reranker, "/v1/rerank", {"query": "a", "documents": ["b"]})["results"][0]
    [scored] = ok(reranker, "/predict", {"inputs": ["a", "b"]})
    assert scored["label"] == "LABEL_0"
    assert scored["score"] == pytest.approx(surface["relevance_score"], abs=CLOSE)
    [raw] = ok(reranker, "/predict", {"inputs": ["a", "b"], "raw_scores": True})
    assert raw["score"] == pytest.approx(surface["logit"], abs=1e-4)


# -- /tokenize, /decode, /info ---------------------------------------------------------------------


def test_tokenize_and_decode_are_the_packages_tokenizer(embedder: Server, packages: dict[str, Path]) -> None:
    tokenizer = Tokenizer.from_file(str(packages["embedding"] / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    texts = ["Hello, world!", "unbelievable tokenization"]
    answered = ok(embedder, "/tokenize", {"inputs": texts})
    for text, tokens in zip(texts, answered, strict=True):
        enc = tokenizer.encode(text)
        assert [t["id"] for t in tokens] == enc.ids
        assert [t["special"] for t in tokens] == [bool(s) for s in enc.special_tokens_mask]
        for token, (start, stop) in zip(tokens, enc.offsets, strict=True):
            if token["special"]:
                assert token["start"] is None and token["stop"] is None
            else:
                assert (token["start"], token["stop"]) == (start, stop)
                assert token["text"] == text[start:stop]
    plain = ok(embedder, "/tokenize", {"inputs": texts[0], "add_special_tokens": False})
    assert [t["id"] for t in plain[0]] == tokenizer.encode(texts[0], add_special_tokens=False).ids
    ids = [[t["id"] for t in tokens] for tokens in answered]
    assert ok(embedder, "/decode", {"ids": ids}) == [tokenizer.decode(one) for one in ids]
    kept = ok(embedder, "/decode", {"ids": ids[0], "skip_special_tokens": False})
    assert kept == [tokenizer.decode(ids[0], skip_special_tokens=False)]
    tei_error(embedder, "/decode", {"ids": [10**9]}, 422, "validation")
    # A prompt goes in front of the text, and the offsets are into the whole.
    prompted = ok(embedder, "/tokenize", {"inputs": texts[0], "prompt_name": "query"})[0]
    assert [t["id"] for t in prompted] == tokenizer.encode(PROMPTS["query"] + texts[0]).ids
    tei_error(embedder, "/tokenize", {"inputs": "a", "prompt_name": "nope"}, 422, "validation")


def test_info_describes_the_model_in_teis_fields(
    embedder: Server, reranker: Server, classifier: Server
) -> None:
    info = embedder.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 128 and info["max_client_batch_size"] == 8
    assert info["model_id"] == ok(embedder, "/v1/embeddings", {"input": "a"})["model"]
    for field in ("model_sha", "model_dtype", "max_batch_tokens", "auto_truncate", "version"):
        assert field in info
    assert reranker.get("/info").json()["model_type"] == {
        "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    }
    labels = ok(classifier, "/v1/classify", {"input": "a"})["labels"]
    classifier_type = classifier.get("/info").json()["model_type"]["classifier"]
    assert classifier_type["id2label"] == {str(i): label for i, label in enumerate(labels)}


# -- POST /, errors -----------------------------------------------------------------------------


def test_root_routes_by_the_models_kind(embedder: Server, reranker: Server, classifier: Server) -> None:
    assert ok(embedder, "/", {"inputs": TEXTS}) == ok(embedder, "/embed", {"inputs": TEXTS})
    body = {"query": QUERY, "texts": TEXTS}
    assert ok(reranker, "/", body) == ok(reranker, "/rerank", body)
    assert ok(classifier, "/", {"inputs": "a"}) == ok(classifier, "/predict", {"inputs": "a"})


def test_errors_come_in_teis_shape(embedder: Server, classifier: Server) -> None:
    tei_error(embedder, "/embed", {"inputs": []}, 400, "empty")
    tei_error(embedder, "/rerank", {"query": "q", "texts": []}, 400, "empty")
    assert "inputz" in tei_error(embedder, "/embed", {"inputz": "a"}, 422, "validation")
    tei_error(embedder, "/embed", {"inputs": ["a"] * 9}, 413, "validation")  # --max-inputs 8
    tei_error(embedder, "/predict", {"inputs": "a"}, 424, "backend")  # not a classifier
    tei_error(classifier, "/embed", {"inputs": "a"}, 424, "backend")  # not an embedding model
    # The surfaces' own routes keep their own error shape.
    own = embedder.post("/v1/embeddings", {"inputz": "a"}).json()
    assert set(own) == {"error"} and "code" in own["error"]


# -- the real clients -------------------------------------------------------------------------------


def test_huggingface_hub_feature_extraction_on_minilm(minilm: Server) -> None:
    from huggingface_hub import InferenceClient
    from sentence_transformers import SentenceTransformer

    client = InferenceClient(base_url=minilm.url)
    texts = ["A man is eating food.", "The new movie is awesome", "Das ist ein Beispielsatz."]
    vectors = client.feature_extraction(texts)
    assert vectors.shape == (len(texts), 384)
    np.testing.assert_allclose(vectors, openai_vectors(minilm, texts), atol=CLOSE)
    reference = SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts, convert_to_numpy=True)
    cosine = np.sum(_unit(vectors) * _unit(reference), axis=1)
    assert cosine.min() >= 0.99999, cosine
    one = client.feature_extraction(texts[0], normalize=True, truncate=True, truncation_direction="left")
    np.testing.assert_allclose(one[0], vectors[0], atol=CLOSE)


def test_normalize_false_is_the_pooled_vector_before_the_packages_normalize(minilm: Server) -> None:
    """TEI's `normalize: false` on a package with a Normalize module answers the pooled vector,
    as sentence-transformers' modules before Normalize give it (TEI does not read modules.json)."""
    from huggingface_hub import InferenceClient
    from sentence_transformers import SentenceTransformer

    texts = ["A man is eating food.", "The new movie is awesome"]
    full = SentenceTransformer(str(minilm_dir()), device="cpu")
    pooled_only = SentenceTransformer(modules=[full[0], full[1]], device="cpu")
    reference = pooled_only.encode(texts, convert_to_numpy=True)
    assert not np.allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-3)
    raw = np.asarray(ok(minilm, "/embed", {"inputs": texts, "normalize": False}))
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-4)
    assert np.sum(_unit(raw) * _unit(reference), axis=1).min() >= 0.99999
    via_client = InferenceClient(base_url=minilm.url).feature_extraction(texts, normalize=False)
    np.testing.assert_allclose(via_client, raw, atol=CLOSE)
    # /v1/embeddings follows the package (unit vectors) unless the option says otherwise.
    assert np.allclose(np.linalg.norm(openai_vectors(minilm, texts), axis=1), 1.0, atol=1e-5)


def test_an_absent_truncate_is_the_servers_auto_truncate(minilm: Server) -> None:
    info = minilm.get("/info").json()
    assert info["auto_truncate"] is True
    text = "retrieval " * (info["max_input_length"] + 50)
    truncated = ok(minilm, "/embed", {"inputs": text, "truncate": True})
    assert ok(minilm, "/embed", {"inputs": text}) == truncated
    tei_error(minilm, "/embed", {"inputs": text, "truncate": False}, 413, "validation")


def test_huggingface_hub_text_classification(classifier: Server) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=classifier.url)
    answered = client.text_classification(TEXTS[1])
    surface = ok(classifier, "/v1/classify", {"input": TEXTS[1]})
    expected = sorted(
        zip(surface["results"][0]["probabilities"], surface["labels"], strict=True), reverse=True
    )
    assert [e.label for e in answered] == [label for _, label in expected]
    np.testing.assert_allclose([e.score for e in answered], [s for s, _ in expected], atol=CLOSE)
    top = client.text_classification(TEXTS[1], top_k=1)
    assert [e.label for e in top] == [expected[0][1]]


def test_tokenize_reaches_any_family_through_the_plugin_contract(
    module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """/tokenize asks the model for its tokenizer (LoadedModel.tokenizer), so it serves an NLI
    decision model too, and refuses a plugin model without one in TEI's shape."""
    from tokenizers import Tokenizer

    from vllm_srun.testing.nli_fixtures import write_fixture as write_nli_fixture

    root = tmp_path_factory.mktemp("tokenize-families")
    nli = write_nli_fixture(root / "nli")
    server = module_server(str(nli))
    tokens = ok(server, "/tokenize", {"inputs": "the parcel arrived"})
    expected = Tokenizer.from_file(str(nli / "tokenizer.json")).encode("the parcel arrived")
    assert [t["id"] for t in tokens[0]] == expected.ids
    from helpers import write_keywords

    keywords = module_server(str(write_keywords(root / "kw")))
    tei_error(keywords, "/tokenize", {"inputs": "refund"}, 424, "backend")

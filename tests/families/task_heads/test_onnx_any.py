"""ONNX for anything else: a package of a model type no table row covers serves from its graph.

The network here is Transformers' RoBERTa-PreLayerNorm (model_type "roberta-prelayernorm"),
which the native engine does not implement: exported to onnx/model.onnx, its package serves
on onnxruntime with labels from config.json, token type ids sent exactly when the graph takes
them, text pairs, and sentence-transformers pooling over the graph's hidden state. Numbers
against Transformers: probabilities within 1e-4, embeddings at cosine >= 0.99999.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import Harness

pytestmark = pytest.mark.torch

from vllm_srun.plugins.architectures import declared  # noqa: E402
from vllm_srun.plugins.surfaces import (  # noqa: E402
    ClassifyRequest,
    EmbeddingsRequest,
    TextPair,
)
from vllm_srun.registry.loader import ModelOptions, load_model  # noqa: E402

LABELS = ["negative", "neutral", "positive"]


def texts(seed: int, count: int = 5) -> list[str]:
    from vllm_srun.testing.tokenizer_fixtures import WORDS

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(n))) for n in rng.integers(1, 25, size=count)]


def package(out: Path, *, head: str, type_vocab_size: int) -> tuple[Path, Any]:
    """A tiny RoBERTa-PreLayerNorm package with only an ONNX graph (and config, tokenizer)."""
    import torch
    import transformers

    from vllm_srun.testing import task_heads_fixtures as fx
    from vllm_srun.testing.tokenizer_fixtures import bytelevel_tokenizer

    tok, vocab, ids = bytelevel_tokenizer()
    out.mkdir(parents=True)
    tok.save(str(out / "tokenizer.json"))
    config = transformers.RobertaPreLayerNormConfig(
        **fx.TINY,
        vocab_size=vocab,
        pad_token_id=ids["pad"],
        max_position_embeddings=fx.MAX_POSITIONS + ids["pad"] + 1,
        type_vocab_size=type_vocab_size,
    )
    torch.manual_seed(7)
    if head == "sequence":
        config.id2label = dict(enumerate(LABELS))
        config.label2id = {label: i for i, label in enumerate(LABELS)}
        model = transformers.RobertaPreLayerNormForSequenceClassification(config).eval()
    else:
        model = transformers.RobertaPreLayerNormModel(config, add_pooling_layer=False).eval()
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(str(out))
    fx._export_onnx(model, out / "onnx" / "model.onnx", bert=type_vocab_size > 1, hidden=head != "sequence")
    if head != "sequence":
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        (out / "modules.json").write_text(json.dumps(modules))
        (out / "1_Pooling").mkdir()
        (out / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True})
        )
    return out, model


def reference(model: Any, th: Harness, path: Path, rows: list[list[int]], types: list[Any] | None) -> Any:
    import torch

    out = []
    for i, row in enumerate(rows):
        kwargs = {"input_ids": torch.tensor([row])}
        if types is not None and types[i] is not None:
            kwargs["token_type_ids"] = torch.tensor([types[i]])
        with torch.no_grad():
            out.append(model(**kwargs))
    return out


def test_the_model_type_is_not_in_the_table(tmp_path: Path) -> None:
    assert declared({"model_type": "roberta-prelayernorm", "architectures": ["RobertaPreLayerNormModel"]}) is None


@pytest.mark.parametrize("type_vocab_size", [1, 2], ids=["no-type-ids", "type-ids"])
def test_a_classifier_serves_from_its_graph_with_pairs(th: Harness, tmp_path: Path, type_vocab_size: int) -> None:
    import torch

    path, hf = package(tmp_path / "cls", head="sequence", type_vocab_size=type_vocab_size)
    from vllm_srun.plugins.discovery import load_plugins

    # No engine named: the native engine refuses the architecture, auto goes on to onnxruntime.
    model, placement = load_model(load_plugins(), ModelOptions(ref=str(path)), with_engine=True)
    assert placement.engine == "onnxruntime"
    assert model.info.heads[0].labels == LABELS
    singles = texts(1)
    pairs = [TextPair(text=a, text_pair=b) for a, b in zip(texts(2), texts(3), strict=True)]
    for inputs in (singles, pairs):
        request = ClassifyRequest(input=inputs)  # type: ignore[arg-type]
        plan = model.plan_surface("classify", request)
        rows = [i.token_ids for i in plan.items]
        types = [i.type_ids for i in plan.items]
        assert all(t is None for t in types) == (type_vocab_size == 1 or inputs is singles)
        got = th.roundtrip(model, "classify", request)
        for result, ref in zip(got.results, reference(hf, th, path, rows, types), strict=True):
            want = torch.softmax(ref.logits[0].double(), -1).numpy()
            np.testing.assert_allclose(result.probabilities, want, atol=1e-4, rtol=0)


def test_an_embedder_gets_sentence_transformers_pooling_over_the_hidden_state(th: Harness, tmp_path: Path) -> None:
    path, hf = package(tmp_path / "emb", head="model", type_vocab_size=1)
    from vllm_srun.plugins.discovery import load_plugins

    model, placement = load_model(load_plugins(), ModelOptions(ref=str(path)), with_engine=True)
    assert placement.engine == "onnxruntime"
    inputs = texts(4)
    request = EmbeddingsRequest(input=inputs)
    rows = [i.token_ids for i in model.plan_surface("embeddings", request).items]
    got = th.roundtrip(model, "embeddings", request)
    for item, ref in zip(got.data, reference(hf, th, path, rows, None), strict=True):
        want = ref.last_hidden_state[0].double().mean(0).numpy()
        vector = np.asarray(item.embedding, dtype=np.float64)
        cosine = vector @ want / np.linalg.norm(vector) / np.linalg.norm(want)
        assert cosine >= 0.99999, cosine

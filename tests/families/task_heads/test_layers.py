"""`layer` and `input_type` on /v1/embeddings.

`layer` L is the model's output after encoder layer L (Transformers' `hidden_states[L]`), then
the package's Pooling, Dense and Normalize modules, as sentence-transformers' AdaptiveLayerLoss
reads an earlier layer. Held here to the Transformers reference (atol 1e-5) on the BERT and
ModernBERT fixtures and to sentence-transformers on all-MiniLM-L6-v2; the native engine serves
every layer, the onnxruntime engine only the last. `input_type` picks the package's prompt of
that name, as `SentenceTransformer.encode(prompt_name=...)` does.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from families.task_heads.harness import Harness, pool, unit
from helpers import Server, minilm_dir

from vllm_srun.families.task_heads.sentence import declared_layers
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import EmbeddingsRequest
from vllm_srun.queue.planning import plan_with_keys
from vllm_srun.testing.task_heads_fixtures import add_sentence_transformers

ATOL = 1e-5
TEXTS = ["good", "John Smith lives in Paris and works at Google.", "what a terrible movie , i hate it"]
# (variant, its Pooling) on two encoder layers each.
FIXTURES = [("bert-embedding", "mean"), ("modernbert-embedding", "cls")]


def request(**fields: Any) -> EmbeddingsRequest:
    return msgspec.convert({"input": TEXTS, **fields}, EmbeddingsRequest)


def vectors(th: Harness, model: Any, **fields: Any) -> np.ndarray:
    response = th.roundtrip(model, "embeddings", request(**fields))
    return np.array([d.embedding for d in response.data], dtype=np.float64)


def hidden_states(th: Harness, path: Path, rows: list[list[int]], layer: int) -> list[np.ndarray]:
    """Transformers' `hidden_states[layer]` of each row, from one right-padded batch."""
    import torch

    model = th.hf(path)
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    with torch.no_grad():
        states = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    return [states[layer][i, : len(r)].double().numpy() for i, r in enumerate(rows)]


@pytest.mark.torch
@pytest.mark.parametrize(("variant", "pooling"), FIXTURES)
@pytest.mark.parametrize("layer", [1, 2])
def test_layer_matches_transformers_hidden_states(
    th: Harness, variant: str, pooling: str, layer: int
) -> None:
    model = th.load(variant, "native")
    assert model.info.embedding is not None and model.info.embedding.layers == [1, 2]
    rows = [item.token_ids for item in model.plan_surface("embeddings", request()).items]
    want = np.array([unit(pool(h, pooling)) for h in hidden_states(th, th.package(variant), rows, layer)])
    got = vectors(th, model, layer=layer)
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    if layer == 2:  # the last layer is the default: the same vectors, bit for bit
        np.testing.assert_array_equal(got, vectors(th, model))
    else:
        assert not np.allclose(got, vectors(th, model), atol=1e-3)


@pytest.mark.torch
def test_onnxruntime_engine_serves_the_last_layer_only(th: Harness) -> None:
    model = th.load("bert-embedding", "onnxruntime")
    assert model.info.embedding is not None and model.info.embedding.layers == [2]
    with pytest.raises(UnsupportedOption) as caught:
        model.plan_surface("embeddings", request(layer=1))
    assert caught.value.param == "layer"
    assert "only its last layer, 2" in caught.value.message
    np.testing.assert_array_equal(vectors(th, model, layer=2), vectors(th, model))


def test_declared_layers_by_engine() -> None:
    class PluginEngineModel:  # an engine that says nothing of exits runs the last layer only
        pass

    class Exits:
        exit_layers = (1, 2, 3)

    assert declared_layers(3, Exits(), has_weights=True) == [1, 2, 3]
    assert declared_layers(3, PluginEngineModel(), has_weights=True) == [3]
    assert declared_layers(3, None, has_weights=True) == [1, 2, 3]  # a replica, for native workers
    assert declared_layers(3, None, has_weights=False) == [3]  # an ONNX-only package
    assert declared_layers(4, Exits(), has_weights=True) == [4]  # exits that miss the last layer
    assert declared_layers(0, Exits(), has_weights=True) == []


def test_undeclared_layers_are_refused_naming_layer(th: Harness) -> None:
    model = th.load("bert-embedding", None)  # an app replica: plans without an engine
    assert model.info.embedding is not None and model.info.embedding.layers == [1, 2]
    with pytest.raises(UnsupportedOption) as caught:
        model.plan_surface("embeddings", request(layer=3))
    assert caught.value.param == "layer"
    assert "layers 1..2" in caught.value.message
    with pytest.raises(msgspec.ValidationError, match="layer"):
        request(layer=0)


def test_cache_keys_separate_layers(th: Harness) -> None:
    model = th.load("bert-embedding", None)

    def keys(**fields: Any) -> list[str]:
        return [i.cache_key for i in plan_with_keys(model, "embeddings", request(**fields)).items]

    default, first, last = keys(), keys(layer=1), keys(layer=2)
    assert last == default  # the last layer named is the default: one cache entry
    assert not set(first) & set(default)
    assert [i.output for i in model.plan_surface("embeddings", request(layer=1)).items] == ["mean@1"] * 3


def test_representation_reports_the_layer(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    for fields, layer in (({}, 2), ({"layer": 1}, 1), ({"layer": 2}, 2)):
        plan = model.plan_surface("embeddings", request(options={"return_meta": True}, **fields))
        assert plan.state.extra.get("layer") == (None if layer == 2 else layer)
        results = [np.zeros(model.hidden_size, dtype=np.float32) + 1 for _ in plan.items]
        meta = msgspec.to_builtins(model.finish_surface(plan, results).meta)
        assert meta["representation"]["layer"] == layer


# input_type -> the package's prompts ------------------------------------------------------------


def test_input_type_without_prompts_is_the_models_refusal_naming_it(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    with pytest.raises(UnsupportedOption) as caught:  # 422: the prompts are the package's
        model.plan_surface("embeddings", request(input_type="query"))
    assert caught.value.param == "input_type"
    assert "no prompt named 'query'" in caught.value.message


@pytest.mark.torch
def test_input_type_matches_encode_with_prompt_name(th: Harness, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    path = Path(shutil.copytree(th.package("bert-embedding"), tmp_path / "prompted"))
    prompts = {"query": "query: ", "document": "passage: "}
    add_sentence_transformers(path, prompts=prompts, include_prompt=False)
    model = th.load_path(path, "native")
    reference = SentenceTransformer(str(path), device="cpu")
    for input_type in ("query", "document"):
        want = reference.encode(TEXTS, prompt_name=input_type)
        np.testing.assert_allclose(vectors(th, model, input_type=input_type), want, atol=ATOL, rtol=0)
    query = plan_with_keys(model, "embeddings", request(input_type="query")).items
    document = plan_with_keys(model, "embeddings", request(input_type="document")).items
    assert not {i.cache_key for i in query} & {i.cache_key for i in document}


@pytest.mark.torch
def test_layer_with_a_prompt_left_out_of_pooling(th: Harness, tmp_path: Path) -> None:
    """The engine returns layer 1's token states ("hidden@1") and finish pools past the prompt."""
    path = Path(shutil.copytree(th.package("bert-embedding"), tmp_path / "prompted"))
    add_sentence_transformers(path, prompts={"query": "query: "}, include_prompt=False)
    model = th.load_path(path, "native")
    plan = model.plan_surface("embeddings", request(input_type="query", layer=1))
    assert {i.output for i in plan.items} == {"hidden@1"}
    skip = plan.state.skip
    assert skip > 1
    states = hidden_states(th, path, [i.token_ids for i in plan.items], 1)
    want = np.array([unit(h[skip:].mean(0)) for h in states])
    np.testing.assert_allclose(vectors(th, model, input_type="query", layer=1), want, atol=ATOL, rtol=0)


# all-MiniLM-L6-v2 against sentence-transformers ---------------------------------------------------


def st_layer(reference: Any, texts: list[str], layer: int) -> np.ndarray:
    """sentence-transformers' vectors from an earlier layer, as AdaptiveLayerLoss reads them: the
    Transformer module's `all_layer_embeddings[layer]` through the modules after it."""
    import torch

    transformer = reference[0]
    features = reference.tokenize(texts)
    config = transformer.auto_model.config
    config.output_hidden_states = True
    try:
        with torch.no_grad():
            out = transformer(features)
            out["token_embeddings"] = out["all_layer_embeddings"][layer]
            for module in list(reference)[1:]:
                out = module(out)
    finally:
        config.output_hidden_states = False
    return np.asarray(out["sentence_embedding"].numpy(), dtype=np.float64)


@pytest.mark.torch
def test_minilm_layers_match_sentence_transformers(th: Harness) -> None:
    from sentence_transformers import SentenceTransformer

    model = th.load_path(minilm_dir(), "native", name="minilm")
    assert model.info.embedding is not None and model.info.embedding.layers == [1, 2, 3, 4, 5, 6]
    reference = SentenceTransformer(str(minilm_dir()), device="cpu")
    for layer in (1, 3, 6):
        np.testing.assert_allclose(
            vectors(th, model, layer=layer), st_layer(reference, TEXTS, layer), atol=ATOL, rtol=0
        )
    np.testing.assert_allclose(vectors(th, model), reference.encode(TEXTS), atol=ATOL, rtol=0)


# Over HTTP --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    pytest.importorskip("torch")
    th = Harness(tmp_path_factory.mktemp("layers"))
    return module_server(str(th.package("modernbert-embedding")), "--served-model-name", "mb")


@pytest.mark.torch
def test_layer_over_http(server: Server, th: Harness) -> None:
    model = next(m for m in server.get("/v1/models").json()["data"] if m["id"] == "mb")
    assert model["embedding"]["layers"] == [1, 2]
    body = {"model": "mb", "input": TEXTS, "options": {"return_meta": True}}
    default = server.post("/v1/embeddings", body)
    early = server.post("/v1/embeddings", {**body, "layer": 1})
    assert default.status_code == early.status_code == 200, early.text
    assert early.json()["meta"]["representation"]["layer"] == 1
    assert default.json()["meta"]["representation"]["layer"] == 2
    got = np.array([d["embedding"] for d in early.json()["data"]])
    # The same weights in process, checked against Transformers above.
    local = th.load("modernbert-embedding", "native")
    np.testing.assert_allclose(got, vectors(th, local, layer=1), atol=ATOL, rtol=0)
    # A repeat comes from the cache, and from layer 1's entries, not the default's.
    again = server.post("/v1/embeddings", {**body, "layer": 1})
    np.testing.assert_array_equal(np.array([d["embedding"] for d in again.json()["data"]]), got)
    assert early.json()["meta"]["cache"] == {"hits": 0, "misses": len(TEXTS)}
    assert again.json()["meta"]["cache"] == {"hits": len(TEXTS), "misses": 0}
    assert not np.allclose(got, np.array([d["embedding"] for d in default.json()["data"]]), atol=1e-3)
    refused = server.post("/v1/embeddings", {**body, "layer": 3})
    assert refused.status_code == 422  # a layer the model does not declare: its refusal
    assert refused.json()["error"]["code"] == "unsupported_surface"
    assert refused.json()["error"]["param"] == "layer"
    assert server.post("/v1/embeddings", {**body, "layer": 0}).status_code == 400

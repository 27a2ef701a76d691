"""Sparse, multi-vector and token outputs over HTTP on the onnxruntime engine: one server, three
graphs (a SPLADE *ForMaskedLM exported with its logits and hidden state, the same checkpoint
with the hidden state alone, and bge-m3's hidden state with its two .pt heads). /v1/models lists
what each graph gives, the answers equal the reference formulas at 1e-5 and repeat from the
cache under a key per kind, and a kind the graph cannot give is a 422 naming options.output and
the engine. The native engine's answers on the same packages: tests/families/task_heads/
test_onnx_outputs.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from families.task_heads.output_references import (
    ATOL,
    TEXTS,
    bge_m3_reference,
    export_graph,
    splade_reference,
)
from helpers import Server, ok, serve_named

NAMES = ("splade", "m3", "hidden-only")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("onnx-output-packages")
    splade = export_graph(
        write_fixture(root / "splade", variant="bert-splade"), ("logits", "last_hidden_state")
    )
    hidden = shutil.copytree(splade, root / "hidden-only", ignore=shutil.ignore_patterns("onnx"))
    return {
        "splade": splade,
        "m3": write_fixture(root / "m3", variant="xlm-roberta-bge-m3", onnx=True),
        "hidden-only": export_graph(hidden, ("last_hidden_state",)),
    }


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named({name: packages[name] for name in NAMES}), "--engine", "onnxruntime")


def _embed(server: Server, model: str, texts: list[str], kind: str) -> dict:
    body = {"model": model, "input": texts, "options": {"output": kind, "return_meta": True}}
    return ok(server, "/v1/embeddings", body)  # type: ignore[no-any-return]


def _sparse_gap(item: dict, reference: dict[int, float]) -> float:
    pairs = dict(zip(item["sparse_embedding"]["indices"], item["sparse_embedding"]["values"], strict=True))
    assert set(pairs) == set(reference)
    return max(abs(pairs[i] - reference[i]) for i in reference)


def test_models_list_what_each_graph_gives(server: Server) -> None:
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert {name: cards[name]["outputs"] for name in NAMES} == {
        "splade": ["sparse", "tokens"],
        "m3": ["dense", "sparse", "multi_vector", "tokens"],
        "hidden-only": ["tokens"],
    }
    assert {cards[name]["engine"] for name in NAMES} == {"onnxruntime"}


def test_outputs_match_the_formulas_and_repeat_from_the_cache(
    server: Server, packages: dict[str, Path]
) -> None:
    texts = [f"{t} onnx" for t in TEXTS]  # inputs no other test sends: the first request misses
    _, lexical, multi, tokens = bge_m3_reference(packages["m3"], texts)
    for kind, reference in (("sparse", lexical), ("multi_vector", multi), ("tokens", tokens)):
        first, second = _embed(server, "m3", texts, kind), _embed(server, "m3", texts, kind)
        # Kinds never share an entry: each one's first request misses, its repeat hits.
        assert first["meta"]["cache"] == {"hits": 0, "misses": len(texts)}, kind
        assert second["meta"]["cache"] == {"hits": len(texts), "misses": 0}, kind
        assert first["data"] == second["data"]
        for item, ref in zip(first["data"], reference, strict=True):
            if kind == "sparse":
                assert _sparse_gap(item, ref) < ATOL
            else:
                assert float(np.abs(np.array(item["token_embeddings"]) - ref).max()) < ATOL, kind
    reference = splade_reference(packages["splade"], texts)
    data = _embed(server, "splade", texts, "sparse")["data"]
    assert max(_sparse_gap(item, ref) for item, ref in zip(data, reference, strict=True)) < ATOL


def test_a_kind_the_graph_cannot_give_is_refused_by_name(server: Server) -> None:
    for body in ({"input": "good"}, {"input": "good", "options": {"output": "sparse"}}):
        response = server.post("/v1/embeddings", {"model": "hidden-only", **body})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "options.output"
        assert "onnxruntime engine" in error["message"] and "masked-LM logits" in error["message"]
    tokens = _embed(server, "hidden-only", ["a b c"], "tokens")["data"][0]["token_embeddings"]
    assert len(tokens) == 5  # [CLS] a b c [SEP]

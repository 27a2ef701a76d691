"""PyLate ColBERT packages (colbert.py): queries and documents as `pylate.models.ColBERT.encode`
gives them (computed from Transformers by PyLate's steps: colbert_references.py), at ATOL =
1e-5, on a BERT and a ModernBERT backbone, with the expansion tokens attended to or not (the
engine's key mask) and without expansion; MaxSim rerank as PyLate's colbert_scores_pairwise;
the key mask on every forward path; the package refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from families.task_heads.colbert_references import (
    ATOL,
    DIM,
    DOCUMENT_LENGTH,
    QUERY,
    QUERY_LENGTH,
    TEXTS,
    colbert_reference,
    maxsim,
    write_pylate,
)
from families.task_heads.harness import Harness

from vllm_srun.errors import PackageError
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import EmbeddingsRequest, RerankRequest

pytestmark = pytest.mark.torch

# name -> (backbone, attend_to_expansion_tokens, do_query_expansion)
PACKAGES = {
    "bert": ("bert", False, True),
    "bert-attend": ("bert", True, True),
    "bert-no-expansion": ("bert", False, False),
    "modernbert": ("modernbert", False, True),
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("pylate")
    return {
        name: write_pylate(root / name, backbone=b, attend_to_expansion_tokens=a, do_query_expansion=e)
        for name, (b, a, e) in PACKAGES.items()
    }


@pytest.fixture(scope="module")
def models(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, TaskHeadsModel]:
    harness = Harness(tmp_path_factory.mktemp("unused"))
    return {name: harness.load_path(path, "native", name=name) for name, path in packages.items()}


def _embed(model: TaskHeadsModel, body: dict[str, Any]) -> list[np.ndarray]:
    request = msgspec.convert(body | {"options": {"overflow": "truncate"}}, EmbeddingsRequest)
    response = Harness.roundtrip(model, "embeddings", request)
    return [np.array(item.token_embeddings, dtype=np.float32) for item in response.data]


def _gap(ours: list[np.ndarray], reference: list[np.ndarray]) -> float:
    worst = 0.0
    for got, want in zip(ours, reference, strict=True):
        assert got.shape == want.shape
        worst = max(worst, float(np.abs(got - want).max()))
    return worst


@pytest.mark.parametrize("name", PACKAGES)
def test_queries_and_documents_match_pylate(models: dict[str, TaskHeadsModel], packages: dict[str, Path], name: str) -> None:
    model = models[name]
    assert model.outputs.served() == ["multi_vector", "tokens"]
    assert model.info.embedding is not None and model.info.embedding.dimension == DIM
    texts = [*TEXTS, "word " * 40]  # the last is truncated, a query and a document alike
    queries = _embed(model, {"input": texts, "input_type": "query"})
    documents = _embed(model, {"input": texts, "input_type": "document"})
    assert _gap(queries, colbert_reference(packages[name], texts, is_query=True)) < ATOL
    assert _gap(documents, colbert_reference(packages[name], texts, is_query=False)) < ATOL
    # A document is the default: an embeddings call is mostly indexing.
    assert _gap(_embed(model, {"input": texts}), documents) == 0.0
    expanded = PACKAGES[name][2]
    if expanded:  # every query is query_length vectors, [MASK] ones included
        assert {len(q) for q in queries} == {QUERY_LENGTH}
    else:  # [CLS] [Q] good [SEP]
        assert len(queries[0]) == 4 and len(queries[-1]) == QUERY_LENGTH
    assert len(documents[-1]) == DOCUMENT_LENGTH


def test_the_key_mask_changes_the_expanded_query(models: dict[str, TaskHeadsModel]) -> None:
    """A test that can fail: attending to the [MASK] tokens or not gives other numbers for the
    query's own tokens (the same weights, so only the mask differs)."""
    masked = _embed(models["bert"], {"input": TEXTS[0], "input_type": "query"})[0]
    attended = _embed(models["bert-attend"], {"input": TEXTS[0], "input_type": "query"})[0]
    assert masked.shape == attended.shape
    assert float(np.abs(masked - attended).max()) > 1e-3


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_rerank_is_pylate_maxsim(models: dict[str, TaskHeadsModel], packages: dict[str, Path], name: str) -> None:
    (query,) = colbert_reference(packages[name], [QUERY], is_query=True)
    expected = [maxsim(query, d) for d in colbert_reference(packages[name], TEXTS, is_query=False)]
    body = {"query": QUERY, "documents": TEXTS, "options": {"overflow": "truncate"}}
    request = msgspec.convert(body, RerankRequest)  # multi_vector: the default
    body = Harness.roundtrip(models[name], "rerank", request)
    scores = {r.index: r.relevance_score for r in body.results}
    assert max(abs(scores[i] - e) for i, e in enumerate(expected)) < ATOL
    assert [r.index for r in body.results] == sorted(range(len(TEXTS)), key=lambda i: -expected[i])


def test_query_and_document_have_their_own_cache_keys(models: dict[str, TaskHeadsModel]) -> None:
    model = models["bert"]
    plans = {
        role: model.plan_surface("embeddings", msgspec.convert({"input": "good", "input_type": role}, EmbeddingsRequest))
        for role in ("query", "document")
    }
    query, document = plans["query"].items[0], plans["document"].items[0]
    assert query.token_ids != document.token_ids  # [Q] or [D] after [CLS], and the expansion
    assert len(query.token_ids) == QUERY_LENGTH and query.key_tokens == 4  # [CLS] [Q] good [SEP]
    assert query.key_extra == "task_heads/colbert/keys=4" and document.key_extra == "task_heads/colbert"
    attend = models["bert-attend"].plan_surface(
        "embeddings", msgspec.convert({"input": "good", "input_type": "query"}, EmbeddingsRequest)
    ).items[0]
    assert attend.key_tokens == 0 and attend.key_extra == "task_heads/colbert"


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_the_key_mask_holds_on_every_path(models: dict[str, TaskHeadsModel], name: str) -> None:
    """Packed rows, the padded small batch on torch and on onnxruntime: the same rows with
    tokens that are not keys give the packed answer (one row, and rows of unequal length)."""
    model = models[name]
    engine = model.engine_model
    assert engine is not None and len(engine.paths) > 1, engine.paths
    truncate = {"options": {"overflow": "truncate"}}
    short = ["good", QUERY, "a terrible movie"]  # shorter than a query: each has [MASK] tokens
    request = msgspec.convert({"input": short, "input_type": "query"} | truncate, EmbeddingsRequest)
    items = model.plan_surface("embeddings", request).items
    assert all(item.key_tokens for item in items)
    from vllm_srun.plugins.base import Batch, WorkItem

    document = model.plan_surface("embeddings", msgspec.convert({"input": TEXTS[1]} | truncate, EmbeddingsRequest)).items[0]
    for rows in ([items[1]], items, [items[0], document]):
        batch = Batch.from_items(rows)
        packed = engine.encode(batch, path="packed")
        for path in engine.paths[1:]:
            for got, want in zip(engine.encode(batch, path=path), packed, strict=True):
                np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=f"path {path}")
        unmasked = Batch.from_items([WorkItem(token_ids=i.token_ids, output=i.output) for i in rows])
        assert float(np.abs(engine.encode(unmasked, path="packed")[0] - packed[0]).max()) > 1e-4


def test_refusals(models: dict[str, TaskHeadsModel], packages: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    model = models["bert"]
    for body, field in (
        ({"input": "good", "options": {"output": "dense"}}, "options.output"),
        ({"input": [[5, 6, 7]]}, "input"),
    ):
        with pytest.raises(UnsupportedOption) as caught:
            model.plan_surface("embeddings", msgspec.convert(body, EmbeddingsRequest))
        assert caught.value.param == field
    with pytest.raises(UnsupportedOption, match=r"options\.output"):
        model.plan_surface("rerank", msgspec.convert({"query": "a", "documents": ["b"], "options": {"output": "dense"}}, RerankRequest))
    harness = Harness(tmp_path / "h")

    def broken(name: str, change: Any) -> Path:
        package = tmp_path / name
        shutil.copytree(packages["bert"], package)
        change(package)
        return package

    def no_prefix(package: Path) -> None:
        config = json.loads((package / "config_sentence_transformers.json").read_text())
        (package / "config_sentence_transformers.json").write_text(json.dumps(config | {"query_prefix": "[query] "}))

    def tanh(package: Path) -> None:
        config = json.loads((package / "1_Dense" / "config.json").read_text())
        config["activation_function"] = "torch.nn.modules.activation.Tanh"
        (package / "1_Dense" / "config.json").write_text(json.dumps(config))

    def long_queries(package: Path) -> None:
        # Expanded to query_length whatever the text: past the position table every query would
        # fail in the forward (an index past the position embeddings), so the load refuses it.
        config = json.loads((package / "config_sentence_transformers.json").read_text())
        positions = json.loads((package / "config.json").read_text())["max_position_embeddings"]
        (package / "config_sentence_transformers.json").write_text(json.dumps(config | {"query_length": positions + 1}))

    with pytest.raises(PackageError, match=r"no token '\[query\] ' \(query_prefix\)"):
        harness.load_path(broken("prefix", no_prefix), "native")
    with pytest.raises(PackageError, match=r"query_length \d+ .* positions"):
        harness.load_path(broken("long-queries", long_queries), "native")
    with pytest.raises(PackageError, match=r"activation 'torch.nn.modules.activation.Tanh' is not served"):
        harness.load_path(broken("tanh", tanh), "native")


def test_dense_weights_as_a_pytorch_state_dict(models: dict[str, TaskHeadsModel], packages: dict[str, Path], tmp_path: Path) -> None:
    """Older PyLate packages ship 1_Dense/pytorch_model.bin: read with weights_only=True, the same
    numbers; one holding anything but tensors is refused, never unpickled in full."""
    import shutil

    import torch
    from safetensors.torch import load_file

    package = tmp_path / "bin"
    shutil.copytree(packages["bert"], package)
    dense = package / "1_Dense"
    torch.save(load_file(str(dense / "model.safetensors")), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    model = Harness(tmp_path / "h").load_path(package, "native", name="bin")
    body = {"input": TEXTS, "input_type": "query"}
    assert _gap(_embed(model, body), _embed(models["bert"], body)) == 0.0
    torch.save({"linear.weight": Path("not a tensor")}, dense / "pytorch_model.bin")
    with pytest.raises(PackageError, match=r"pytorch_model\.bin is not a tensor-only PyTorch state dict"):
        Harness(tmp_path / "h2").load_path(package, "native", name="bin")

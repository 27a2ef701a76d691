"""Sparse and multi-vector outputs (outputs.py; `options.output`) against their reference
formulas computed straight from Transformers, at ATOL = 1e-5:

- SPLADE (BertForMaskedLM, DistilBertForMaskedLM): per vocabulary id, the max over the
  attention-masked tokens of log(1 + relu(logits));
- bge-m3 (XLMRobertaModel + sparse_linear.pt + colbert_linear.pt): lexical weights relu(linear(h))
  per token, max per id, the tokenizer's cls/eos/pad/unk ids (special_tokens_map) and zero
  weights left out; ColBERT vectors colbert_linear(h[1:]), L2-normalised; MaxSim rerank;
- every token's last hidden state (`tokens`).

The reference runs the texts as one right-padded batch, so the mask is the attention mask.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from families.task_heads.harness import Harness
from families.task_heads.output_references import ATOL, TEXTS, bge_m3_reference, splade_reference

from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads import outputs
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import EmbeddingsRequest, RerankRequest, SparseEmbedding

SPLADE = ("bert-splade", "distilbert-splade")
BGE_M3 = "xlm-roberta-bge-m3"

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("outputs")
    return {v: write_fixture(root / v, variant=v) for v in (*SPLADE, BGE_M3)}


@pytest.fixture(scope="module")
def models(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, TaskHeadsModel]:
    harness = Harness(tmp_path_factory.mktemp("unused"))
    return {v: harness.load_path(path, "native", name=v) for v, path in packages.items()}


def _embed(model: TaskHeadsModel, body: dict[str, Any]) -> Any:
    return Harness.roundtrip(model, "embeddings", msgspec.convert(body, EmbeddingsRequest))


def _as_dict(item: Any) -> dict[int, float]:
    embedding = item.sparse_embedding
    assert item.embedding is None and item.token_embeddings is None
    assert isinstance(embedding, SparseEmbedding)
    assert embedding.indices == sorted(embedding.indices)
    return dict(zip(embedding.indices, embedding.values, strict=True))


def _close(ours: dict[int, float], reference: dict[int, float]) -> float:
    """The largest difference of two sparse vectors; their ids must be the same."""
    assert set(ours) == set(reference)
    return max((abs(ours[i] - reference[i]) for i in reference), default=0.0)


@pytest.mark.parametrize("variant", SPLADE)
def test_splade_matches_the_masked_lm_formula(models: dict[str, TaskHeadsModel], packages: dict[str, Path], variant: str) -> None:
    model = models[variant]
    assert model.info.surfaces == ["embeddings"]
    assert model.outputs.served() == ["sparse", "tokens"]
    # Sparse is a SPLADE model's default output: no option needed.
    body = _embed(model, {"input": TEXTS})
    reference = splade_reference(packages[variant], TEXTS)
    worst = max(_close(_as_dict(item), ref) for item, ref in zip(body.data, reference, strict=True))
    assert worst < ATOL
    assert all(len(ref) > 10 for ref in reference)  # a formula that dropped ids would differ


def test_bge_m3_outputs_match_flag_embedding_formulas(models: dict[str, TaskHeadsModel], packages: dict[str, Path]) -> None:
    model = models[BGE_M3]
    assert model.outputs.served() == ["dense", "sparse", "multi_vector", "tokens"]
    dense, lexical, multi, tokens = bge_m3_reference(packages[BGE_M3], TEXTS)
    got = {kind: _embed(model, {"input": TEXTS, "options": {"output": kind}}).data for kind in model.outputs.served()}
    worst: dict[str, float] = {}
    worst["dense"] = max(float(np.abs(np.array(i.embedding) - d).max()) for i, d in zip(got["dense"], dense, strict=True))
    worst["sparse"] = max(_close(_as_dict(i), ref) for i, ref in zip(got["sparse"], lexical, strict=True))
    for kind, refs in (("multi_vector", multi), ("tokens", tokens)):
        for item, ref in zip(got[kind], refs, strict=True):
            array = np.array(item.token_embeddings)
            assert array.shape == ref.shape
            worst[kind] = max(worst.get(kind, 0.0), float(np.abs(array - ref).max()))
    assert all(value < ATOL for value in worst.values()), worst
    assert len(got["multi_vector"][0].token_embeddings[0]) == 24  # colbert_dim


def test_multi_vector_rerank_is_maxsim(models: dict[str, TaskHeadsModel], packages: dict[str, Path]) -> None:
    model = models[BGE_M3]
    query, documents = "who lives in paris", TEXTS
    _, _, multi, _ = bge_m3_reference(packages[BGE_M3], [query, *documents])
    q = multi[0]
    expected = [float((q @ d.T).max(axis=1).sum()) for d in multi[1:]]
    request = msgspec.convert({"query": query, "documents": documents, "options": {"output": "multi_vector"}}, RerankRequest)
    body = Harness.roundtrip(model, "rerank", request)
    scores = {r.index: r.relevance_score for r in body.results}
    assert max(abs(scores[i] - e) for i, e in enumerate(expected)) < ATOL
    assert [r.index for r in body.results] == sorted(range(len(expected)), key=lambda i: -expected[i])



@pytest.mark.parametrize(
    ("variant", "output"),
    [(v, "splade") for v in SPLADE] + [(BGE_M3, "lexical"), (BGE_M3, "colbert")],
)
def test_output_heads_agree_on_every_path(models: dict[str, TaskHeadsModel], variant: str, output: str) -> None:
    """An output head reads the last hidden state of whichever forward path ran: each path the
    model takes (packed, and the small-batch ones its row declares) gives the packed answer."""
    from vllm_srun.plugins.base import Batch, WorkItem

    model = models[variant]
    engine = model.engine_model
    assert engine is not None
    # BERT, DistilBERT and XLM-R rows all declare the small-batch paths (torch and onnxruntime).
    assert engine.paths == ("packed", "dense", "onnx"), engine.paths
    encoded = [model.encoder.tokenizer.encode(text).ids for text in TEXTS]
    for rows in ([encoded[0]], encoded):  # one row alone, and a mixed small batch
        batch = Batch.from_items([WorkItem(token_ids=r, output=output) for r in rows])
        packed = engine.encode(batch, path="packed")
        assert len(packed) == len(rows)
        for path in engine.paths[1:]:
            for got, want in zip(engine.encode(batch, path=path), packed, strict=True):
                np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=f"path {path}")

def test_output_refusals(models: dict[str, TaskHeadsModel]) -> None:
    splade, m3 = models["bert-splade"], models[BGE_M3]
    with pytest.raises(UnsupportedOption, match=r"options.output: .* gives no 'dense' output; it gives sparse, tokens"):
        splade.plan_surface("embeddings", msgspec.convert({"input": "a", "options": {"output": "dense"}}, EmbeddingsRequest))
    for body, field in (
        ({"dimensions": 8}, "dimensions"),
        ({"layer": 1}, "layer"),
        ({"encoding_format": "base64"}, "encoding_format"),
        ({"options": {"output": "sparse", "normalize": False}}, "options.normalize"),
        ({"options": {"output": "sparse", "overflow": "window"}}, "options.overflow"),
    ):
        request = {"input": "good", "options": {"output": "sparse"}} | body
        with pytest.raises(InvalidRequest, match=rf"^{field}: applies to dense output only") as caught:
            m3.plan_surface("embeddings", msgspec.convert(request, EmbeddingsRequest))
        assert caught.value.param == field
    # Rerank takes dense and multi_vector only: RerankOptions says so, and decoding refuses others.
    with pytest.raises(msgspec.ValidationError, match=r"\$\.options\.output"):
        msgspec.convert({"query": "a", "documents": ["b"], "options": {"output": "sparse"}}, RerankRequest)


def test_output_kind_is_in_the_cache_key(models: dict[str, TaskHeadsModel]) -> None:
    model = models[BGE_M3]
    keys = {}
    for kind in model.outputs.served():
        plan = model.plan_surface("embeddings", msgspec.convert({"input": "good", "options": {"output": kind}}, EmbeddingsRequest))
        keys[kind] = plan.items[0].key_extra
    assert keys == {
        "dense": "task_heads/cls",
        "sparse": "task_heads/lexical",
        "multi_vector": "task_heads/colbert",
        "tokens": "task_heads/hidden",
    }


def test_lexical_weights_keep_the_max_and_drop_special_and_zero_weights() -> None:
    kinds = outputs.OutputKinds(sparse="lexical", unused_ids=frozenset({0, 2}))
    ids = np.array([0, 7, 5, 7, 9, 2])
    row = np.array([3.0, 0.5, 0.0, 1.5, 0.25, 4.0], dtype=np.float32)
    assert outputs.sparse(kinds, row, ids) == ([7, 9], [1.5, 0.25])


class _Touch:
    """A pickle that would create a file if it were ever unpickled in full."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Path.touch, (self.marker,))


def test_a_state_dict_that_is_not_tensors_is_refused_unexecuted(packages: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    import torch

    from vllm_srun.errors import PackageError

    package = tmp_path / "m3"
    shutil.copytree(packages[BGE_M3], package)
    marker = tmp_path / "executed"
    torch.save({"weight": _Touch(marker)}, package / "sparse_linear.pt")
    with pytest.raises(PackageError, match=r"sparse_linear\.pt is not a tensor-only PyTorch state dict"):
        Harness(tmp_path / "h").load_path(package, "native")
    assert not marker.exists()


@pytest.mark.parametrize("variant", SPLADE)
def test_a_sentence_transformers_sparse_encoder_package_matches_sparse_encoder(
    packages: dict[str, Path], tmp_path: Path, variant: str
) -> None:
    """The SparseEncoder form of the same checkpoint (MLMTransformer + SpladePooling), against
    sentence-transformers' own SparseEncoder.encode; its max_seq_length is the model's limit."""
    import shutil

    from sentence_transformers import SparseEncoder

    from vllm_srun.testing.task_heads_fixtures import add_sparse_encoder

    package = add_sparse_encoder(shutil.copytree(packages[variant], tmp_path / variant), max_seq_length=12)
    model = Harness(tmp_path / "h").load_path(package, "native")
    assert model.info.max_tokens == 12 and model.outputs.served() == ["sparse", "tokens"]
    body = _embed(model, {"input": TEXTS, "options": {"overflow": "truncate"}})
    reference = SparseEncoder(str(package), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    for item, row in zip(body.data, reference, strict=True):
        ours = _as_dict(item)
        assert set(ours) == set(np.flatnonzero(row).tolist())
        assert max(abs(v - float(row[i])) for i, v in ours.items()) < ATOL


def test_a_sparse_encoder_pooling_it_does_not_serve_is_refused(packages: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    from vllm_srun.errors import PackageError
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.testing.task_heads_fixtures import add_sparse_encoder

    package = add_sparse_encoder(shutil.copytree(packages["bert-splade"], tmp_path / "sum"), pooling_strategy="sum")
    family = Harness(tmp_path / "h").family
    assert family.detect(ModelPackage(package))
    with pytest.raises(PackageError, match=r"1_SpladePooling/config.json .*: pooling_strategy 'sum' is not served"):
        family.verify(ModelPackage(package))

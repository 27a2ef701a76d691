"""The sparse, multi-vector and token outputs on the onnxruntime engine: every kind a package's
graph makes possible equals the native engine's answer on the same package, and the reference
formulas (output_references.py), at ATOL = 1e-5; a kind the graph cannot give is left out of
the model's outputs at load and refused when planned (422 naming options.output and the
engine), never failed at forward time.

Graphs: a SPLADE package's *ForMaskedLM exported with its masked-LM logits and last hidden
state, or with the hidden state alone, or with pooled logits alone (a classifier's shape);
bge-m3's with its last hidden state (the fixture writer's export).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from families.task_heads.harness import Harness
from families.task_heads.output_references import (
    ATOL,
    TEXTS,
    bge_m3_reference,
    export_graph,
    splade_reference,
)

from vllm_srun.errors import ConfigError
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import EmbeddingsRequest, RerankRequest

SPLADE = ("bert-splade", "distilbert-splade")
BGE_M3 = "xlm-roberta-bge-m3"

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("onnx-outputs")
    out = {
        v: export_graph(write_fixture(root / v, variant=v), ("logits", "last_hidden_state")) for v in SPLADE
    }
    out[BGE_M3] = write_fixture(root / BGE_M3, variant=BGE_M3, onnx=True)
    # The same SPLADE checkpoint with graphs that cannot give SPLADE.
    for name, graph in (("hidden-only", ("last_hidden_state",)), ("classifier", ("pooled_logits",))):
        out[name] = export_graph(shutil.copytree(out["bert-splade"], root / name, ignore=_no_graph), graph)
    return out


def _no_graph(directory: str, names: list[str]) -> list[str]:
    return ["onnx"] if "onnx" in names else []


@pytest.fixture(scope="module")
def models(
    packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], TaskHeadsModel]:
    harness = Harness(tmp_path_factory.mktemp("unused"))
    return {
        (v, engine): harness.load_path(packages[v], engine, name=v)
        for v in (*SPLADE, BGE_M3)
        for engine in ("native", "onnxruntime")
    }


def _embed(model: TaskHeadsModel, body: dict[str, Any]) -> Any:
    return Harness.roundtrip(model, "embeddings", msgspec.convert(body, EmbeddingsRequest))


def _sparse(item: Any) -> dict[int, float]:
    embedding = item.sparse_embedding
    return dict(zip(embedding.indices, embedding.values, strict=True))


def _sparse_gap(ours: dict[int, float], reference: dict[int, float]) -> float:
    assert set(ours) == set(reference)
    return max(abs(ours[i] - reference[i]) for i in reference)


def _vectors_gap(ours: Any, reference: np.ndarray) -> float:
    array = np.array(ours)
    assert array.shape == reference.shape
    return float(np.abs(array - reference).max())


@pytest.mark.parametrize("variant", SPLADE)
def test_splade_on_onnxruntime_is_the_native_answer(
    models: dict[tuple[str, str], TaskHeadsModel], packages: dict[str, Path], variant: str
) -> None:
    onnx, native = models[(variant, "onnxruntime")], models[(variant, "native")]
    assert onnx.info.outputs == native.info.outputs == ["sparse", "tokens"]
    reference = splade_reference(packages[variant], TEXTS)
    ours = [_sparse(i) for i in _embed(onnx, {"input": TEXTS}).data]  # sparse: the default
    theirs = [_sparse(i) for i in _embed(native, {"input": TEXTS}).data]
    assert max(_sparse_gap(o, n) for o, n in zip(ours, theirs, strict=True)) < ATOL
    assert max(_sparse_gap(o, r) for o, r in zip(ours, reference, strict=True)) < ATOL
    assert all(len(r) > 10 for r in reference)  # a formula that dropped ids would differ
    tokens = {
        engine: _embed(models[(variant, engine)], {"input": TEXTS, "options": {"output": "tokens"}}).data
        for engine in ("onnxruntime", "native")
    }
    for o, n in zip(tokens["onnxruntime"], tokens["native"], strict=True):
        assert _vectors_gap(o.token_embeddings, np.array(n.token_embeddings)) < ATOL


def test_bge_m3_on_onnxruntime_is_the_native_answer(
    models: dict[tuple[str, str], TaskHeadsModel], packages: dict[str, Path]
) -> None:
    onnx, native = models[(BGE_M3, "onnxruntime")], models[(BGE_M3, "native")]
    assert onnx.info.outputs == native.info.outputs == ["dense", "sparse", "multi_vector", "tokens"]
    _, lexical, multi, tokens = bge_m3_reference(packages[BGE_M3], TEXTS)
    for kind, reference in (("sparse", lexical), ("multi_vector", multi), ("tokens", tokens)):
        body = {"input": TEXTS, "options": {"output": kind}}
        ours, theirs = _embed(onnx, body).data, _embed(native, body).data
        for o, n, r in zip(ours, theirs, reference, strict=True):
            if kind == "sparse":
                assert _sparse_gap(_sparse(o), _sparse(n)) < ATOL and _sparse_gap(_sparse(o), r) < ATOL
            else:
                assert _vectors_gap(o.token_embeddings, np.array(n.token_embeddings)) < ATOL, kind
                assert _vectors_gap(o.token_embeddings, r) < ATOL, kind
    assert (
        len(
            _embed(onnx, {"input": "good", "options": {"output": "multi_vector"}}).data[0].token_embeddings[0]
        )
        == 24
    )


def test_a_splade_batch_runs_in_slices_that_bound_the_logits(
    models: dict[tuple[str, str], TaskHeadsModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph answers [rows, width, vocab] logits per run: past LOGITS_BYTES a batch runs in
    slices of rows, with the same answer as in one run."""
    from vllm_srun.engines.onnxruntime import engine

    model = models[("bert-splade", "onnxruntime")]
    body = {"input": TEXTS, "options": {"output": "sparse"}}
    whole = [_sparse(i) for i in _embed(model, body).data]
    runs: list[int] = []
    run = engine.OnnxEngineModel.encode

    def counted(self: Any, batch: Any) -> Any:
        runs.append(len(batch))
        return run(self, batch)

    monkeypatch.setattr(engine.OnnxEngineModel, "encode", counted)
    monkeypatch.setattr(engine, "LOGITS_BYTES", 1)  # one row a run
    sliced = [_sparse(i) for i in _embed(model, body).data]
    assert sliced == whole
    assert runs[0] == len(TEXTS) > 1 and runs[1:] == [1] * len(TEXTS)


def test_maxsim_rerank_on_onnxruntime_is_the_native_answer(
    models: dict[tuple[str, str], TaskHeadsModel],
) -> None:
    body = {"query": "who lives in paris", "documents": TEXTS, "options": {"output": "multi_vector"}}
    scores = {}
    for engine in ("onnxruntime", "native"):
        response = Harness.roundtrip(models[(BGE_M3, engine)], "rerank", msgspec.convert(body, RerankRequest))
        scores[engine] = {r.index: r.relevance_score for r in response.results}
    assert max(abs(scores["onnxruntime"][i] - scores["native"][i]) for i in range(len(TEXTS))) < ATOL


def test_the_cache_key_follows_the_engine_output_kind(models: dict[tuple[str, str], TaskHeadsModel]) -> None:
    def keys(model: TaskHeadsModel) -> dict[str, str]:
        out = {}
        for kind in model.info.outputs:
            body = {"input": "good", "options": {"output": kind}}
            out[kind] = (
                model.plan_surface("embeddings", msgspec.convert(body, EmbeddingsRequest)).items[0].key_extra
            )
        return out

    m3 = keys(models[(BGE_M3, "onnxruntime")])
    assert m3 == {
        "dense": "task_heads/cls",
        "sparse": "task_heads/lexical",
        "multi_vector": "task_heads/colbert",
        "tokens": "task_heads/hidden",
    }
    assert m3 == keys(models[(BGE_M3, "native")])
    assert keys(models[("bert-splade", "onnxruntime")]) == {
        "sparse": "task_heads/splade",
        "tokens": "task_heads/hidden",
    }


def test_a_graph_without_masked_lm_logits_serves_tokens_and_refuses_sparse_at_load(
    packages: dict[str, Path], models: dict[tuple[str, str], TaskHeadsModel], tmp_path: Path
) -> None:
    model = Harness(tmp_path).load_path(packages["hidden-only"], "onnxruntime")
    assert model.info.outputs == ["tokens"]
    for body in ({"input": "good"}, {"input": "good", "options": {"output": "sparse"}}):
        with pytest.raises(
            UnsupportedOption, match=r"^options\.output: .*no 'sparse' output: the onnxruntime engine"
        ) as caught:
            model.plan_surface("embeddings", msgspec.convert(body, EmbeddingsRequest))
        assert caught.value.param == "options.output"
        assert "masked-LM logits" in str(caught.value) and caught.value.message.endswith("it gives tokens")
    got = _embed(model, {"input": TEXTS, "options": {"output": "tokens"}}).data
    want = _embed(models[("bert-splade", "native")], {"input": TEXTS, "options": {"output": "tokens"}}).data
    for o, n in zip(got, want, strict=True):
        assert _vectors_gap(o.token_embeddings, np.array(n.token_embeddings)) < ATOL
    # The native engine reads the same package's safetensors, and gives both.
    assert Harness(tmp_path).load_path(packages["hidden-only"], "native").info.outputs == ["sparse", "tokens"]


def test_a_classifier_graph_in_a_splade_package_is_refused_at_load(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"gives none of its outputs on this engine \(sparse: the onnxruntime engine: .*tokens: ",
    ):
        Harness(tmp_path).load_path(packages["classifier"], "onnxruntime")


def test_an_onnx_only_bge_m3_package_runs_its_heads_on_onnxruntime_under_auto(
    packages: dict[str, Path], models: dict[tuple[str, str], TaskHeadsModel], tmp_path: Path
) -> None:
    """Without safetensors `auto` passes over the native engine, as for any graph-only package;
    the state dicts still give lexical and ColBERT outputs."""
    from vllm_srun.plugins.base import Device
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.registry.loader import resolve_engine

    package = shutil.copytree(
        packages[BGE_M3], tmp_path / "graph-only", ignore=shutil.ignore_patterns("*.safetensors")
    )
    harness = Harness(tmp_path / "h")
    spec = harness.family.describe(ModelPackage(package))
    assert resolve_engine(load_plugins(), spec, Device("cpu"), "auto").name == "onnxruntime"
    model = harness.load_path(package, "onnxruntime")
    assert model.info.outputs == ["dense", "sparse", "multi_vector", "tokens"]
    body = {"input": TEXTS, "options": {"output": "sparse"}}
    got, want = _embed(model, body).data, _embed(models[(BGE_M3, "native")], body).data
    assert max(_sparse_gap(_sparse(o), _sparse(n)) for o, n in zip(got, want, strict=True)) < ATOL


def test_the_state_dicts_are_read_as_on_the_native_engine(packages: dict[str, Path], tmp_path: Path) -> None:
    """torch.load(weights_only=True): a pickle of anything but tensors is refused unexecuted, and
    a projection whose width does not fit the graph's hidden state is the package's error."""
    import torch

    from vllm_srun.errors import PackageError

    package = shutil.copytree(packages[BGE_M3], tmp_path / "m3")
    marker = tmp_path / "executed"
    torch.save({"weight": _Touch(marker)}, package / "sparse_linear.pt")
    with pytest.raises(PackageError, match=r"sparse_linear\.pt is not a tensor-only PyTorch state dict"):
        Harness(tmp_path / "h").load_path(package, "onnxruntime")
    assert not marker.exists()
    shutil.copy(packages[BGE_M3] / "sparse_linear.pt", package / "sparse_linear.pt")
    torch.save(torch.nn.Linear(7, 24).state_dict(), package / "colbert_linear.pt")
    with pytest.raises(
        PackageError, match=r"colbert_linear\.pt takes 7 features; the ONNX graph's 'last_hidden_state' has"
    ):
        Harness(tmp_path / "h").load_path(package, "onnxruntime")


class _Touch:
    """A pickle that would create a file if it were ever unpickled in full."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Path.touch, (self.marker,))


_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
from pathlib import Path
from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine
from vllm_srun.families.task_heads import TaskHeadsFamily
from vllm_srun.plugins.base import Device
from vllm_srun.plugins.package import ModelPackage
package = ModelPackage(Path(sys.argv[1]))
family, engine = TaskHeadsFamily(), OnnxRuntimeEngine()
spec = family.describe(package)
engine_model = engine.load(spec, Device("cpu"), "float32", engine.read(spec, "float32"))
model = family.load(package, spec, engine_model, name="m3", verification=family.verify(package), numerics="float32")
print(model.info.outputs)
print(model.outputs.refused["sparse"])
"""


def test_without_torch_the_projection_heads_are_refused_at_load(packages: dict[str, Path]) -> None:
    """onnxruntime needs no torch, but reading bge-m3's .pt files does: without it the model
    serves dense and tokens, and says why not the rest."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, str(packages[BGE_M3])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    outputs, reason = run.stdout.strip().splitlines()[-2:]
    assert outputs == "['dense', 'tokens']"
    assert (
        reason.startswith("the onnxruntime engine: ")
        and "needs torch" in reason
        and "sparse_linear.pt" in reason
    )

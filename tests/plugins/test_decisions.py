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
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.decision_bodies import (
    DecisionRequest,
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
    question_types = ("choice", "noul", "score", "set")
    presets = {"polite": {"type": "noul", "instructions": "Is it polite?", "criteria": {"true": "polite"}}}

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
        if question.type == "set":
            return sigmoid(scores)
        return softmax(scores)


CHOICE = {"type": "choice", "instructions": "Which domain?", "criteria": {"math": "maths", "code": "coding"}}
NOUL = {"type": "noul", "instructions": "Does it need reasoning?", "criteria": {"true": "it needs steps"}}
SCORE = {
    "type": "score",
    "instructions": "How complex is it?",
    "levels": ["easy", "medium", "hard", "expert"],
}


def serve(model: DecisionModel, body: dict[str, Any]) -> dict[str, Any]:
    request = msgspec.convert(body, DecisionRequest)
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
    levels = np.arange(4)
    assert score["score"] == pytest.approx(float(np.dot(levels, list(score["probabilities"].values()))))
    assert 0.0 <= score["score"] <= 3.0 and 0.0 <= score["confidence"] <= 1.0
    assert score["legend"] == {"0": "easy", "1": "medium", "2": "hard", "3": "expert"}


@pytest.mark.parametrize(
    ("question", "field"),
    [
        ({"type": "choice", "instructions": "x", "criteria": {"only": "one"}}, "questions.bad.criteria"),
        (
            {
                "type": "choice",
                "instructions": "x",
                "choices": [{"key": "a", "description": " "}, {"key": "b", "description": "b"}],
            },
            "questions.bad.choices[0].description",
        ),
        (
            {"type": "choice", "instructions": "x", "choices": [{"key": "a"}, {"key": "b", "colour": "b"}]},
            "questions.bad.choices[1].colour",
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
        (
            {"type": "score", "instructions": "x", "criteria": ["a", "b"], "levels": ["a", "b"]},
            "questions.bad.criteria",
        ),
        ({"type": "set", "instructions": "x", "criteria": {}}, "questions.bad.criteria"),
        (
            {"type": "set", "instructions": "x", "criteria": {"a": "A"}, "threshold": 2},
            "questions.bad.threshold",
        ),
        (
            {"type": "set", "instructions": "x", "labels": [{"key": "a"}, {"key": "a"}]},
            "questions.bad.labels",
        ),
        ({"type": "span", "instructions": "x", "criteria": {"a": "A"}}, "questions.bad.type"),
        ({**NOUL, "overflow": "window"}, "questions.bad.overflow"),
        ({**NOUL, "head": "broad"}, "questions.bad.head"),
        ({**NOUL, "threshold": 0.5}, "questions.bad.threshold"),
        ({**NOUL, "require_full_input": "yes"}, "questions.bad.require_full_input"),
        ({**NOUL, "over": "nowhere"}, "questions.bad.over"),
        ({"preset": "nope"}, "questions.bad.preset"),
        ("not an object", "questions.bad"),
    ],
)
def test_a_bad_question_fails_alone_naming_its_field(question: Any, field: str) -> None:
    model = StubDecisions()
    body = serve(model, {"state": "hello", "questions": {"good": CHOICE, "bad": question}})
    assert "choice" in body["answers"]["good"]
    bad = body["answers"]["bad"]
    assert bad["error"] == "invalid_question"
    assert bad["message"].startswith(field + ":"), bad["message"]
    assert set(bad) <= {"type", "error", "message"}


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
        msgspec.convert({"state": "s", "questions": {}, "colour": 1}, DecisionRequest)
    request = msgspec.convert({"state": "s", "questions": {"q": 5}}, DecisionRequest)
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
    assert body["answers"]["x"] == {
        "type": "noul",
        "error": "max_length_exceeded",
        "message": "questions.x: too long",
    }
    # A valid question the model cannot answer is not an invalid request: it is answered in place.
    alone = serve(model, {"state": "s", "questions": {"x": explode}})
    assert alone["answers"]["x"]["error"] == "max_length_exceeded"
    request = msgspec.convert({"state": "s", "questions": {"c": CHOICE, "n": NOUL}}, DecisionRequest)
    plan = model.plan_surface("decisions", request)
    results: list[Any] = list(model.run(plan.items))
    results[0] = ItemError("deadline_exceeded", "too late")
    out = model.finish_surface(plan, results)
    assert out.answers["c"].error == "deadline_exceeded"
    assert out.answers["n"].noul is not None
    # A code outside upstream's ItemError vocabulary goes out as one of it, its message kept.
    results[0] = ItemError("forward_failed", "the forward failed: boom")
    failed = model.finish_surface(plan, results).answers["c"]
    assert (failed.error, failed.message) == ("unavailable", "the forward failed: boom")


def test_a_readout_that_is_not_a_distribution_fails_the_question() -> None:
    body = serve(StubDecisions(broken=True), {"state": "s", "questions": {"c": CHOICE}})
    assert body["answers"]["c"]["error"] == "invalid_model_output"


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
    assert reason is not None and "invalid_model_output" in reason
    assert StubDecisions(engine=False).self_check() is None


def test_other_surfaces_and_oversized_requests_are_refused() -> None:
    model = StubDecisions()
    with pytest.raises(UnsupportedSurface):
        model.plan_surface("classify", msgspec.convert({"state": "s", "questions": {}}, DecisionRequest))
    many = {f"q{i}": {**CHOICE, "criteria": {f"k{j}": "d" for j in range(255)}} for i in range(17)}
    with pytest.raises(RequestTooLarge, match="work items"):
        serve(model, {"state": "s", "questions": many})


def test_confidence_is_one_minus_normalised_entropy() -> None:
    assert confidence_of(np.array([1.0, 0.0, 0.0])) == pytest.approx(1.0)
    assert confidence_of(np.array([0.25] * 4)) == pytest.approx(0.0)
    p = np.array([0.7, 0.2, 0.1])
    assert confidence_of(p) == pytest.approx(1 + float((p * np.log(p)).sum()) / np.log(3))


SET = {"type": "set", "instructions": "What does it need?", "criteria": {"maths": "maths", "code": "coding"}}


def test_a_set_answers_its_labels_threshold_and_a_noul_per_label() -> None:
    body = serve(StubDecisions(), {"state": "solve x^2 = 4", "questions": {"c": CHOICE, "t": SET}})
    assert list(body["answers"]) == ["c", "t.maths", "t.code"]
    probabilities = body["sets"]["t"]["probabilities"]
    assert list(probabilities) == ["maths", "code"] and all(0 <= p <= 1 for p in probabilities.values())
    assert body["thresholds"] == {"t": 0.5}
    assert body["sets"]["t"]["selected"] == [k for k, p in probabilities.items() if p > 0.5]
    for label, p in probabilities.items():
        assert body["answers"][f"t.{label}"] == {"type": "noul", "noul": p}
    ordered = {**SET, "criteria": None, "labels": [{"key": "maths", "description": "maths"}, {"key": "code"}]}
    del ordered["criteria"]
    again = serve(
        StubDecisions(), {"state": "solve x^2 = 4", "questions": {"t": {**ordered, "threshold": 0.0}}}
    )
    assert again["sets"]["t"]["selected"] == ["maths", "code"] and again["thresholds"] == {"t": 0.0}
    clash = serve(StubDecisions(), {"state": "s", "questions": {"t": SET, "t.code": NOUL}})
    assert (
        clash["answers"]["t"]["error"] == "invalid_question" and "t.code" in clash["answers"]["t"]["message"]
    )


def test_a_preset_is_the_question_it_names_and_takes_nothing_else() -> None:
    preset = serve(StubDecisions(), {"state": "thanks a lot", "questions": {"p": {"preset": "polite"}}})
    explicit = serve(
        StubDecisions(), {"state": "thanks a lot", "questions": {"p": StubDecisions.presets["polite"]}}
    )
    assert preset["answers"] == explicit["answers"] and preset["usage"] == explicit["usage"]
    assert StubDecisions().info.presets == ["polite"]
    assert StubDecisions().info.question_types == ["choice", "noul", "score", "set"]
    for extra, field in (({"instructions": "x"}, "instructions"), ({"type": "choice"}, "type")):
        body = serve(
            StubDecisions(), {"state": "s", "questions": {"c": CHOICE, "p": {"preset": "polite", **extra}}}
        )
        assert body["answers"]["p"]["error"] == "invalid_question"
        assert body["answers"]["p"]["message"].startswith(f"questions.p.{field}:")


def test_usage_counts_each_states_tokens_alone() -> None:
    model = StubDecisions()
    body = serve(
        model,
        {
            "state": "abc",
            "questions": {"c": CHOICE},
            "states": {"x": {"state": "hello", "questions": {"n": NOUL}}},
        },
    )
    own = sum(len("abc" + d) for d in ("maths", "coding"))
    other = sum(len("hello" + d) for d in ("it needs steps", "false"))
    assert body["usage"] == {"input_tokens": own, "output_tokens": 0}
    assert body["states"]["x"]["usage"] == {"input_tokens": other, "output_tokens": 0}
    assert body["states"]["x"]["model"] == "stub"


def test_over_reads_the_named_fields_and_full_input_is_proved_or_refused() -> None:
    state = {"channel": "chat", "prompt": "hi", "response": "hello"}
    body = serve(StubDecisions(), {"state": state, "questions": {"n": {**NOUL, "over": ["prompt"]}}})
    alone = serve(StubDecisions(), {"state": {"prompt": "hi"}, "questions": {"n": NOUL}})
    assert body["answers"] == alone["answers"]
    by_part = serve(StubDecisions(), {"state": state, "questions": {"n": {**NOUL, "over": "answer"}}})
    assert (
        by_part["answers"]
        == serve(StubDecisions(), {"state": {"response": "hello"}, "questions": {"n": NOUL}})["answers"]
    )
    full = serve(StubDecisions(), {"state": state, "questions": {"n": {**NOUL, "require_full_input": True}}})
    assert full["answers"]["n"]["input_coverage"] == "complete"
    partial = {**NOUL, "require_full_input": True, "over": "prompt"}
    refused = serve(StubDecisions(), {"state": state, "questions": {"c": CHOICE, "n": partial}})
    assert refused["answers"]["n"]["message"].startswith("questions.n.require_full_input:")


def test_fields_of_model_kinds_not_run_here_are_refused() -> None:
    with pytest.raises(UnsupportedOption, match=r"^options.max_tokens: ") as refused:
        serve(StubDecisions(), {"state": "s", "questions": {"c": CHOICE}, "options": {"max_tokens": 64}})
    assert refused.value.param == "options.max_tokens"
    with pytest.raises(InvalidRequest, match=r"^images: .*text only"):
        serve(
            StubDecisions(),
            {"state": "s", "questions": {"c": CHOICE}, "images": ["data:image/png;base64,AA=="]},
        )
    with pytest.raises(InvalidRequest, match=r"^states.x.images: "):
        serve(
            StubDecisions(),
            {
                "states": {
                    "x": {"state": "s", "questions": {"c": CHOICE}, "images": ["data:image/png;base64,AA=="]}
                }
            },
        )
    assert (
        "choice"
        in serve(StubDecisions(), {"state": "s", "questions": {"c": CHOICE}, "images": []})["answers"]["c"]
    )


def test_ordered_forms_equal_their_criteria() -> None:
    pairs = [
        (
            CHOICE,
            {
                **{k: v for k, v in CHOICE.items() if k != "criteria"},
                "choices": [
                    {"key": "math", "description": "maths"},
                    {"key": "code", "description": "coding"},
                ],
            },
        ),
        (
            {**NOUL},
            {
                "type": "noul",
                "instructions": NOUL["instructions"],
                "choices": [{"key": "true", "description": "it needs steps"}],
            },
        ),
        (SCORE, {"type": "score", "instructions": SCORE["instructions"], "criteria": SCORE["levels"]}),
    ]
    for given, ordered in pairs:
        a = serve(StubDecisions(), {"state": "s", "questions": {"q": given}})
        b = serve(StubDecisions(), {"state": "s", "questions": {"q": ordered}})
        assert a["answers"] == b["answers"], (given, ordered)

"""`DecisionModel`: a LoadedModel that answers the decisions surface (`/v1/decisions`, and
`/v1/systemone`, the upstream runtime's name for it).

The base owns the surface: it validates questions (a bad one fails alone with
`invalid_question`), asks the family to `plan` each valid question into work items, hands
each question's results to the family's `answer`, and turns the distribution that returns
into the response (choice, noul, score, confidence). It also runs a start-up `self_check`
and counts questions per type and outcome.

A family writes two methods:

- `plan(state, question, options) -> list[WorkItem]`: one question over one state;
- `answer(question, results) -> probabilities`: one float per `question.options`, in order
  (for noul: P(true), P(false)); the base normalises and checks them.

Either may raise `QuestionError` to fail that question alone.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec
import numpy as np

from vllm_srun.errors import InvalidRequest, RequestTooLarge, UnsupportedSurface
from vllm_srun.plugins.base import EngineModel, ItemError, LoadedModel, ModelInfo, Plan, Result, WorkItem
from vllm_srun.plugins.decision_surface import (
    QUESTION_TYPES,
    DecisionAnswer,
    DecisionsRequest,
    DecisionsResponse,
    DecisionState,
    Question,
    QuestionInvalid,
    StateAnswers,
    StateValue,
    parse_question,
    parse_state,
)
from vllm_srun.plugins.surfaces import DECISIONS, ErrorBody, Options

SURFACE = DECISIONS.name
INVALID_QUESTION = "invalid_question"
ANSWERED = "answered"
# Bounds the forward work one request can ask for (255 choices x many questions adds up fast).
MAX_ITEMS = 4096
# How far a family's distribution may stray from summing to 1 before it is a bug, not rounding.
_SUM_TOLERANCE = 1e-3

# The fixed request `self_check` runs: one question of each type.
SELF_CHECK_REQUEST: dict[str, Any] = {
    "state": {"context": "support chat", "request": "How do I reset my password?"},
    "questions": {
        "topic": {
            "type": "choice",
            "instructions": "What is the request about?",
            "criteria": {"account": "account access", "billing": "billing and payments"},
        },
        "urgent": {"type": "noul", "instructions": "Is the request urgent?"},
        "effort": {
            "type": "score",
            "instructions": "How much effort does the request need?",
            "levels": ["little", "some", "a lot"],
        },
    },
}


class QuestionError(Exception):
    """Raised by a family's `plan` or `answer` to fail one question with `code`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(eq=False)
class _Entry:
    """One question of a request: where it belongs, and either its items or its error."""

    state_name: str | None
    qid: str
    qtype: str | None
    question: Question | None = None
    start: int = 0
    stop: int = 0
    error: ErrorBody | None = None


@dataclass(eq=False)
class _PlanState:
    entries: list[_Entry] = field(default_factory=list)


def confidence_of(probabilities: np.ndarray) -> float:
    """1 - normalised entropy: 1 when one option takes everything, 0 when all are equal."""
    p = probabilities[probabilities > 0]
    if probabilities.size < 2:
        return 1.0
    entropy = float(-(p * np.log(p)).sum())
    return min(1.0, max(0.0, 1.0 - entropy / math.log(probabilities.size)))


class DecisionModel(LoadedModel):
    """A model that answers typed questions (choice, noul, score) about a state.

    `counters` maps (question type, outcome) to a count, outcome being "answered" or an
    error code; an unparseable type counts as "unknown". The app exports it as metrics.
    """

    # The question types this family answers; the others fail with invalid_question.
    question_types: ClassVar[tuple[str, ...]] = QUESTION_TYPES

    def __init__(self, info: ModelInfo, engine_model: EngineModel | None) -> None:
        if SURFACE not in info.surfaces:
            info.surfaces = [*info.surfaces, SURFACE]
        super().__init__(info, engine_model)
        self.counters: dict[tuple[str, str], int] = {}
        # Large requests are planned on worker threads; a read-modify-write must not lose counts.
        self._counters_lock = threading.Lock()

    @abc.abstractmethod
    def plan(self, state: DecisionState, question: Question, options: Options) -> list[WorkItem]:
        """The work items that answer `question` about `state`."""

    @abc.abstractmethod
    def answer(self, question: Question, results: Sequence[np.ndarray]) -> np.ndarray:
        """One probability per `question.options`, from the results of its own items."""

    # -- planning ---------------------------------------------------------------------------

    def plan_surface(self, surface: str, request: Any) -> Plan:
        if surface != SURFACE or not isinstance(request, DecisionsRequest):
            raise UnsupportedSurface(f"model {self.info.name!r} serves {SURFACE} only, not {surface!r}")
        sets: list[tuple[str | None, StateValue | None, dict[str, Any], str]] = [
            (None, request.state, request.questions, "")
        ]
        for extra_name, extra in (request.states or {}).items():
            sets.append((extra_name, extra.state, extra.questions, f"states.{extra_name}."))
        if not any(questions for _, _, questions, _ in sets):
            raise InvalidRequest("questions: the request asks no question")
        state = _PlanState()
        items: list[WorkItem] = []
        for name, value, questions, prefix in sets:
            if not questions:
                continue
            if value is None or (isinstance(value, str) and not value.strip()) or value == {}:
                raise InvalidRequest(f"{prefix}state: required and non-empty when questions are asked")
            parsed = parse_state(value)
            for qid, raw in questions.items():
                path = f"{prefix}questions.{qid}"
                entry, planned = self._plan_one(name, qid, raw, parsed, path, request.options)
                entry.start, entry.stop = len(items), len(items) + len(planned)
                items += planned
                state.entries.append(entry)
        # Only invalid questions make a request invalid; a valid question that cannot be
        # answered (too long for the model) is reported in place, like a classify input.
        if all(e.error is not None and e.error.code == INVALID_QUESTION for e in state.entries):
            reasons = "; ".join(e.error.message for e in state.entries if e.error is not None)
            raise InvalidRequest(f"no valid question: {reasons}")
        if len(items) > MAX_ITEMS:
            raise RequestTooLarge(
                f"questions: {len(items)} work items; at most {MAX_ITEMS} per request (ask fewer questions "
                "or fewer options)"
            )
        return Plan(surface=SURFACE, items=items, state=state)

    def _plan_one(
        self, name: str | None, qid: str, raw: Any, state: DecisionState, path: str, options: Options
    ) -> tuple[_Entry, list[WorkItem]]:
        qtype = raw.get("type") if isinstance(raw, dict) else None
        entry = _Entry(name, qid, qtype if qtype in QUESTION_TYPES else None)
        try:
            question = parse_question(qid, raw, path)
            if question.type not in self.question_types:
                types = ", ".join(self.question_types)
                raise QuestionInvalid(f"{path}.type: this model answers {types} questions only")
            planned = self.plan(state, question, options)
        except QuestionInvalid as exc:
            return self._failed(entry, INVALID_QUESTION, str(exc)), []
        except QuestionError as exc:
            return self._failed(entry, exc.code, f"{path}: {exc.message}"), []
        entry.question = question
        return entry, planned

    def _failed(self, entry: _Entry, code: str, message: str) -> _Entry:
        entry.error = ErrorBody(code, message)
        self._count(entry.qtype, code)
        return entry

    def _count(self, qtype: str | None, outcome: str) -> None:
        key = (qtype or "unknown", outcome)
        with self._counters_lock:
            self.counters[key] = self.counters.get(key, 0) + 1

    # -- finishing --------------------------------------------------------------------------

    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> DecisionsResponse:
        if plan.surface != SURFACE or not isinstance(plan.state, _PlanState):
            raise UnsupportedSurface(f"model {self.info.name!r} cannot finish a {plan.surface!r} plan")
        state = plan.state
        top: dict[str, DecisionAnswer] = {}
        named: dict[str, StateAnswers] = {}
        for entry in state.entries:
            if entry.error is not None:
                answer = DecisionAnswer(type=entry.qtype, error=entry.error)
            else:
                answer = self._answer_one(entry, results[entry.start : entry.stop])
            if entry.state_name is None:
                top[entry.qid] = answer
            else:
                named.setdefault(entry.state_name, StateAnswers(answers={})).answers[entry.qid] = answer
        return DecisionsResponse(model=self.info.name, answers=top, states=named or None)

    def _answer_one(self, entry: _Entry, results: Sequence[Result]) -> DecisionAnswer:
        question = entry.question
        assert question is not None  # entries without a question carry an error
        failed = next((r for r in results if isinstance(r, ItemError)), None)
        try:
            if failed is not None:
                raise QuestionError(failed.code, failed.message)
            arrays = [r for r in results if not isinstance(r, ItemError)]
            probabilities = _checked(self.answer(question, arrays), len(question.options))
        except QuestionError as exc:
            self._count(question.type, exc.code)
            return DecisionAnswer(type=question.type, error=ErrorBody(exc.code, exc.message))
        self._count(question.type, ANSWERED)
        return readout(question, probabilities)

    # -- start-up ---------------------------------------------------------------------------

    def self_check(self) -> str | None:
        """Run a fixed request through plan -> run -> finish; None, or why it failed.

        Without an engine (an app replica) there is nothing to run and the check passes.
        The check's questions are not counted in `counters`.
        """
        if self.engine_model is None:
            return None
        counters = dict(self.counters)
        try:
            raw = dict(SELF_CHECK_REQUEST)
            raw["questions"] = {
                k: q for k, q in SELF_CHECK_REQUEST["questions"].items() if q["type"] in self.question_types
            }
            request = msgspec.convert(raw, DecisionsRequest)
            plan = self.plan_surface(SURFACE, request)
            body = self.finish_surface(plan, self.run(plan.items) if plan.items else [])
            return next(filter(None, (_malformed(k, a) for k, a in body.answers.items())), None)
        except Exception as exc:  # any failure is the reason, not a crash of the start-up
            return f"self-check failed: {type(exc).__name__}: {exc}"
        finally:
            self.counters = counters


def _checked(values: Any, count: int) -> np.ndarray:
    p = np.asarray(values, dtype=np.float64).reshape(-1)
    if p.shape != (count,) or not np.all(np.isfinite(p)) or np.any(p < 0):
        message = f"the model's readout is not {count} probabilities: {p.tolist()}"
        raise QuestionError("forward_failed", message)
    total = float(p.sum())
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise QuestionError("forward_failed", f"the model's probabilities sum to {total}, not 1")
    out: np.ndarray = p / total
    return out


def readout(question: Question, p: np.ndarray) -> DecisionAnswer:
    """The answer to `question` from its probabilities (one per option, summing to 1)."""
    keys = [o.key for o in question.options]
    if question.type == "noul":
        return DecisionAnswer(type="noul", noul=float(p[0]))
    probabilities = {k: float(v) for k, v in zip(keys, p, strict=True)}
    confidence = confidence_of(p)
    if question.type == "choice":
        return DecisionAnswer(
            type="choice", choice=keys[int(np.argmax(p))], probabilities=probabilities, confidence=confidence
        )
    levels = np.arange(1, len(keys) + 1, dtype=np.float64)
    return DecisionAnswer(
        type="score",
        score=float(np.dot(levels, p)),
        probabilities=probabilities,
        confidence=confidence,
        legend={o.key: o.description for o in question.options},
    )


def _malformed(qid: str, answer: DecisionAnswer) -> str | None:
    """Why a self-check answer is not a well-formed answer, or None."""
    if answer.error is not None:
        return f"question {qid!r} failed: {answer.error.code}: {answer.error.message}"
    if answer.type == "noul":
        ok = answer.noul is not None and 0.0 <= answer.noul <= 1.0
        return None if ok else f"question {qid!r}: noul {answer.noul} is not a probability"
    p = np.array(list((answer.probabilities or {}).values()))
    if p.size == 0 or np.any(p < 0) or np.any(p > 1) or abs(float(p.sum()) - 1.0) > 1e-6:
        return f"question {qid!r}: probabilities {p.tolist()} do not sum to 1"
    if answer.confidence is None or not 0.0 <= answer.confidence <= 1.0:
        return f"question {qid!r}: confidence {answer.confidence} is outside [0, 1]"
    if answer.type == "score" and not (answer.score is not None and 1.0 <= answer.score <= p.size):
        return f"question {qid!r}: score {answer.score} is outside 1..{p.size}"
    return None

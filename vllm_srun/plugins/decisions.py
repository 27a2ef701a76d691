"""`DecisionModel`: the base of a LoadedModel that answers the decisions surface.

The base validates questions, fills presets, selects each question's part of a state, builds
the response and runs the start-up `self_check`. A family writes `plan(state, question,
options) -> list[WorkItem]` and `answer(question, results) -> probabilities` (one float per
option, in order; noul: P(true), P(false); set: each label's P). Either may raise
`QuestionError` to fail that question alone.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec
import numpy as np

from vllm_srun import defaults
from vllm_srun.errors import InvalidRequest, RequestTooLarge, UnsupportedSurface
from vllm_srun.plugins.base import EngineModel, ItemError, LoadedModel, ModelInfo, Plan, Result, WorkItem
from vllm_srun.plugins.bodies import ItemErrorCode, UnsupportedOption, Usage, item_error_code
from vllm_srun.plugins.decision_bodies import (
    Answer,
    DecisionRequest,
    DecisionResponse,
    DecisionStateResponse,
    SetAnswer,
)
from vllm_srun.plugins.decision_questions import (
    KNOWN_TYPES,
    QUESTION_TYPES,
    DecisionState,
    Question,
    QuestionInvalid,
    StateValue,
    expand_preset,
    parse_question,
    parse_state,
    select_state,
)
from vllm_srun.plugins.surfaces import DECISIONS, Options

SURFACE = DECISIONS.name
INVALID_QUESTION = "invalid_question"
INVALID_MODEL_OUTPUT = "invalid_model_output"
ANSWERED = "answered"
COMPLETE: Literal["complete"] = "complete"
# Bounds the forward work one request can ask for (255 choices x many questions adds up fast).
MAX_ITEMS = 4096
# How far a family's distribution may stray from summing to 1 before it is a bug, not rounding.
_SUM_TOLERANCE = 1e-3

# The fixed request `self_check` runs: one question of each type the model answers.
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
        "needs": {
            "type": "set",
            "instructions": "What does the request need?",
            "criteria": {"login": "help logging in", "refund": "a refund"},
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

    qid: str
    qtype: str | None
    question: Question | None = None
    start: int = 0
    stop: int = 0
    error: ItemErrorCode | None = None
    message: str = ""


@dataclass(eq=False)
class _StatePlan:
    """The questions about one state (`name` None: the request's own) and the tokens they read."""

    name: str | None
    entries: list[_Entry] = field(default_factory=list)
    input_tokens: int = 0


@dataclass(eq=False)
class _PlanState:
    states: list[_StatePlan] = field(default_factory=list)

    @property
    def entries(self) -> list[_Entry]:
        return [e for s in self.states for e in s.entries]


def confidence_of(probabilities: np.ndarray) -> float:
    """1 - normalised entropy: 1 when one option takes everything, 0 when all are equal."""
    p = probabilities[probabilities > 0]
    if probabilities.size < 2:
        return 1.0
    entropy = float(-(p * np.log(p)).sum())
    return min(1.0, max(0.0, 1.0 - entropy / math.log(probabilities.size)))


class DecisionModel(LoadedModel):
    """A model that answers typed questions (choice, noul, score, and set where the family
    declares it) about a state.

    `question_types` and `presets` are what the model's card lists; `scan_tokens` is the scan
    budget of a family that reads a long state part in windows (None: it reads one bounded
    input, and refuses `options.max_tokens`); `modalities` what a state may carry (text only:
    `images` are refused). `counters` maps (question type, outcome) to a count, outcome being
    "answered" or an ItemError code; an unparseable type counts as "unknown".
    """

    # The question types this family answers; the others fail with invalid_question.
    question_types: ClassVar[tuple[str, ...]] = QUESTION_TYPES
    # The questions the family defines, by name: each a raw question (type, instructions, …).
    presets: ClassVar[Mapping[str, dict[str, Any]]] = {}
    scan_tokens: ClassVar[int | None] = None
    modalities: ClassVar[tuple[str, ...]] = ("text",)
    # What a set question selects above when it gives no threshold of its own.
    set_threshold: ClassVar[float] = defaults.SET_THRESHOLD

    def __init__(self, info: ModelInfo, engine_model: EngineModel | None) -> None:
        if SURFACE not in info.surfaces:
            info.surfaces = [*info.surfaces, SURFACE]
        info.question_types = list(self.question_types)
        info.presets = list(self.presets)
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
        if surface != SURFACE or not isinstance(request, DecisionRequest):
            raise UnsupportedSurface(f"model {self.info.name!r} serves {SURFACE} only, not {surface!r}")
        self._check_request(request)
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
            planned_state = _StatePlan(name)
            state.states.append(planned_state)
            if not questions:
                continue
            if value is None or (isinstance(value, str) and not value.strip()) or value in ({}, []):
                raise InvalidRequest(f"{prefix}state: required and non-empty when questions are asked")
            for qid, raw in questions.items():
                path = f"{prefix}questions.{qid}"
                entry, planned = self._plan_one(qid, raw, value, set(questions), path, request.options)
                entry.start, entry.stop = len(items), len(items) + len(planned)
                items += planned
                planned_state.entries.append(entry)
                planned_state.input_tokens += sum(len(item.token_ids) for item in planned)
        # Only invalid questions make a request invalid; a valid question that cannot be
        # answered (too long for the model) is reported in place, like a classify input.
        if all(e.error == INVALID_QUESTION for e in state.entries):
            reasons = "; ".join(e.message for e in state.entries)
            raise InvalidRequest(f"no valid question: {reasons}")
        if len(items) > MAX_ITEMS:
            raise RequestTooLarge(
                f"questions: {len(items)} work items; at most {MAX_ITEMS} per request (ask fewer questions "
                "or fewer options)"
            )
        return Plan(surface=SURFACE, items=items, state=state)

    def _check_request(self, request: DecisionRequest) -> None:
        """Request fields only another kind of model reads are refused, never ignored."""
        if request.options.max_tokens is not None and self.scan_tokens is None:
            raise UnsupportedOption(  # the model's refusal (no scan budget): 422
                "options.max_tokens: a scan budget, taken only by a model that reads a long state part in "
                "windows (its card's limits.max_scan_tokens); this model reads one bounded input "
                "(options.overflow says what a longer one gets)",
                param="options.max_tokens",
            )
        if "image" in self.modalities:
            return
        images = [("images", request.images)] + [
            (f"states.{name}.images", s.images) for name, s in (request.states or {}).items()
        ]
        for where, given in images:
            if given:
                raise InvalidRequest(
                    f"{where}: this model reads text only (its card's modalities: "
                    f"{', '.join(self.modalities)}); images need a model with the image modality",
                    param=where,
                )

    def _plan_one(
        self, qid: str, raw: Any, value: StateValue, taken: set[str], path: str, options: Options
    ) -> tuple[_Entry, list[WorkItem]]:
        qtype = raw.get("type") if isinstance(raw, dict) else None
        entry = _Entry(qid, qtype if qtype in KNOWN_TYPES else None)
        try:
            raw = expand_preset(raw, dict(self.presets), path)
            if isinstance(raw, dict) and raw.get("type") in KNOWN_TYPES:
                entry.qtype = raw["type"]
            question = parse_question(qid, raw, path, types=self.question_types)
            if question.type == "set":
                clash = next((f"{qid}.{o.key}" for o in question.options if f"{qid}.{o.key}" in taken), None)
                if clash is not None:
                    raise QuestionInvalid(f"{path}: its label answer {clash!r} is also a question id")
            read, whole = select_state(value, question.over, path)
            if question.require_full_input and not whole:
                raise QuestionInvalid(
                    f"{path}.require_full_input: the question reads only the state fields its `over` "
                    "names, not every supplied part"
                )
            if question.require_full_input and options.overflow != "reject":
                # Read whole or fail with max_length_exceeded: never cut.
                options = msgspec.structs.replace(options, overflow="reject")
            planned = self.plan(parse_state(read), question, options)
        except QuestionInvalid as exc:
            return self._failed(entry, INVALID_QUESTION, str(exc)), []
        except QuestionError as exc:
            return self._failed(entry, exc.code, f"{path}: {exc.message}"), []
        entry.question = question
        return entry, planned

    def _failed(self, entry: _Entry, code: str, message: str) -> _Entry:
        entry.error, entry.message = item_error_code(code), message
        self._count(entry.qtype, entry.error)
        return entry

    def _count(self, qtype: str | None, outcome: str) -> None:
        key = (qtype or "unknown", outcome)
        with self._counters_lock:
            self.counters[key] = self.counters.get(key, 0) + 1

    # -- finishing --------------------------------------------------------------------------

    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> DecisionResponse:
        if plan.surface != SURFACE or not isinstance(plan.state, _PlanState):
            raise UnsupportedSurface(f"model {self.info.name!r} cannot finish a {plan.surface!r} plan")
        own, *others = [self._finish_state(s, results) for s in plan.state.states]
        named = {
            s.name or "": body for s, body in zip(plan.state.states[1:], others, strict=True) if s.entries
        }
        return DecisionResponse(
            model=own.model,
            answers=own.answers,
            usage=own.usage,
            sets=own.sets,
            thresholds=own.thresholds,
            states=named or None,
        )

    def _finish_state(self, planned: _StatePlan, results: Sequence[Result]) -> DecisionStateResponse:
        body = DecisionStateResponse(
            model=self.info.name, answers={}, usage=Usage(input_tokens=planned.input_tokens, output_tokens=0)
        )
        for entry in planned.entries:
            if entry.error is not None:
                body.answers[entry.qid] = Answer(type=entry.qtype, error=entry.error, message=entry.message)
            else:
                self._answer_one(entry, results[entry.start : entry.stop], body)
        return body

    def _answer_one(self, entry: _Entry, results: Sequence[Result], body: DecisionStateResponse) -> None:
        question = entry.question
        assert question is not None  # entries without a question carry an error
        failed = next((r for r in results if isinstance(r, ItemError)), None)
        try:
            if failed is not None:
                raise QuestionError(failed.code, failed.message)
            arrays = [r for r in results if not isinstance(r, ItemError)]
            probabilities = _checked(self.answer(question, arrays), len(question.options), question.type)
        except QuestionError as exc:
            code = item_error_code(exc.code)
            self._count(question.type, code)
            body.answers[entry.qid] = Answer(type=question.type, error=code, message=exc.message)
            return
        self._count(question.type, ANSWERED)
        coverage = COMPLETE if question.require_full_input else None
        if question.type != "set":
            answer = readout(question, probabilities)
            body.answers[entry.qid] = msgspec.structs.replace(answer, input_coverage=coverage)
            return
        threshold = self.set_threshold if question.threshold is None else question.threshold
        labelled = {o.key: float(p) for o, p in zip(question.options, probabilities, strict=True)}
        body.sets = {
            **(body.sets or {}),
            entry.qid: SetAnswer(
                selected=[k for k, p in labelled.items() if p >= threshold],
                probabilities=labelled,
                input_coverage=coverage,
            ),
        }
        body.thresholds = {**(body.thresholds or {}), entry.qid: threshold}
        for label, p in labelled.items():
            body.answers[f"{entry.qid}.{label}"] = Answer(type="noul", noul=p)

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
            request = msgspec.convert(raw, DecisionRequest)
            plan = self.plan_surface(SURFACE, request)
            body = self.finish_surface(plan, self.run(plan.items) if plan.items else [])
            return next(filter(None, (_malformed(k, a) for k, a in body.answers.items())), None)
        except Exception as exc:  # any failure is the reason, not a crash of the start-up
            return f"self-check failed: {type(exc).__name__}: {exc}"
        finally:
            self.counters = counters


def _checked(values: Any, count: int, qtype: str) -> np.ndarray:
    """The family's readout as probabilities: a distribution, or for a set one P per label."""
    p = np.asarray(values, dtype=np.float64).reshape(-1)
    if p.shape != (count,) or not np.all(np.isfinite(p)) or np.any(p < 0):
        message = f"the model's readout is not {count} probabilities: {p.tolist()}"
        raise QuestionError(INVALID_MODEL_OUTPUT, message)
    if qtype == "set":
        if np.any(p > 1):
            raise QuestionError(
                INVALID_MODEL_OUTPUT, f"the model's label probabilities exceed 1: {p.tolist()}"
            )
        return p
    total = float(p.sum())
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise QuestionError(INVALID_MODEL_OUTPUT, f"the model's probabilities sum to {total}, not 1")
    out: np.ndarray = p / total
    return out


def readout(question: Question, p: np.ndarray) -> Answer:
    """The answer to a choice, noul or score `question` from its probabilities (one per option,
    summing to 1). A score's levels are 0..n-1, as upstream numbers them."""
    keys = [o.key for o in question.options]
    if question.type == "noul":
        return Answer(type="noul", noul=float(p[0]))
    probabilities = {k: float(v) for k, v in zip(keys, p, strict=True)}
    confidence = confidence_of(p)
    if question.type == "choice":
        return Answer(
            type="choice", choice=keys[int(np.argmax(p))], probabilities=probabilities, confidence=confidence
        )
    levels = np.arange(len(keys), dtype=np.float64)
    return Answer(
        type="score",
        score=float(np.dot(levels, p)),
        probabilities=probabilities,
        confidence=confidence,
        legend={o.key: o.description for o in question.options},
    )


def _malformed(qid: str, answer: Answer) -> str | None:
    """Why a self-check answer is not a well-formed answer, or None."""
    if answer.error is not None:
        return f"question {qid!r} failed: {answer.error}: {answer.message}"
    if answer.type == "noul":
        ok = answer.noul is not None and 0.0 <= answer.noul <= 1.0
        return None if ok else f"question {qid!r}: noul {answer.noul} is not a probability"
    p = np.array(list((answer.probabilities or {}).values()))
    if p.size == 0 or np.any(p < 0) or np.any(p > 1) or abs(float(p.sum()) - 1.0) > 1e-6:
        return f"question {qid!r}: probabilities {p.tolist()} do not sum to 1"
    if answer.confidence is None or not 0.0 <= answer.confidence <= 1.0:
        return f"question {qid!r}: confidence {answer.confidence} is outside [0, 1]"
    if answer.type == "score" and not (answer.score is not None and 0.0 <= answer.score <= p.size - 1):
        return f"question {qid!r}: score {answer.score} is outside 0..{p.size - 1}"
    return None

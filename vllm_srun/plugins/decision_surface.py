"""The `/v1/decisions` surface: request and response bodies, and questions in parsed form.

Questions are decoded as raw JSON objects and validated one by one (`parse_question`), so a
question with a bad field fails alone (`invalid_question`, naming the field) while its
siblings are answered. Everything else in the request is strict, like the other surfaces.

A state is a text or a JSON object. Of an object, the `request`/`user`/`prompt` fields are
the user part, `answer`/`response` the answer part and every other field context
(`DecisionState`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from vllm_srun.plugins.bodies import ErrorBody, Options

# The question types. `choice` picks one of several keyed options. `noul` (read "no/yes") is a
# yes/no question: its answer is one number, `noul` = P(true), the probability that the
# instructions hold of the state; its optional criteria describe what "true" and "false" mean.
# `score` rates the state on levels 1..n and answers their expected value.
QuestionType = Literal["choice", "noul", "score"]
QUESTION_TYPES: tuple[str, ...] = ("choice", "noul", "score")

MIN_CHOICES, MAX_CHOICES = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
USER_FIELDS = ("request", "user", "prompt")
ANSWER_FIELDS = ("answer", "response")

StateValue = str | dict[str, Any]

# -- questions as the OpenAPI document describes them ------------------------------------------
#
# A request's questions stay raw JSON until `parse_question` validates each one alone (so one
# bad question fails alone); these types say what it accepts, for the document and clients.

# What `_text_field` takes: a string with something other than whitespace in it.
Text = Annotated[str, msgspec.Meta(pattern=r"\S")]
Unset = msgspec.UnsetType  # a field that may be left out, but not given as null


class ChoiceOption(msgspec.Struct, forbid_unknown_fields=True):
    key: Text
    description: Text


class ChoiceQuestion(msgspec.Struct, forbid_unknown_fields=True, tag="choice", tag_field="type"):
    """Picks one option: exactly one of `criteria` ({key: description}) or `choices` (said
    here only: a JSON schema of a tagged union cannot say it)."""

    instructions: Text
    criteria: (
        Annotated[dict[Text, Text], msgspec.Meta(min_length=MIN_CHOICES, max_length=MAX_CHOICES)] | Unset
    ) = msgspec.UNSET
    choices: (
        Annotated[list[ChoiceOption], msgspec.Meta(min_length=MIN_CHOICES, max_length=MAX_CHOICES)] | Unset
    ) = msgspec.UNSET


class NoulCriteria(msgspec.Struct, forbid_unknown_fields=True):
    """What "true" and "false" mean; either may be left out."""

    true: Text | Unset = msgspec.UNSET
    false: Text | Unset = msgspec.UNSET


class NoulQuestion(msgspec.Struct, forbid_unknown_fields=True, tag="noul", tag_field="type"):
    instructions: Text
    criteria: NoulCriteria | Unset = msgspec.UNSET


class ScoreQuestion(msgspec.Struct, forbid_unknown_fields=True, tag="score", tag_field="type"):
    instructions: Text
    levels: Annotated[list[Text], msgspec.Meta(min_length=MIN_LEVELS, max_length=MAX_LEVELS)]


QuestionBody = ChoiceQuestion | NoulQuestion | ScoreQuestion


def _inlined(kind: Any) -> dict[str, Any]:
    """`kind`'s JSON schema as msgspec writes it, with its `$defs` put in place of their refs
    (a schema inside another document cannot point at its own root)."""
    schema = msgspec.json.schema(kind)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            own = {k: inline(v) for k, v in node.items() if k not in ("$ref", "discriminator")}
            if ref.startswith("#/$defs/"):
                return {**inline(defs[ref.removeprefix("#/$defs/")]), **own}
            return own
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    inlined: dict[str, Any] = inline(schema)
    return inlined


# `questions` as the document shows it: {id: a choice, noul or score question}.
Questions = Annotated[
    dict[str, Any],
    msgspec.Meta(extra_json_schema={"additionalProperties": _inlined(QuestionBody)}),
]


class StateQuestions(msgspec.Struct, forbid_unknown_fields=True):
    """One named extra state of a request and the questions asked about it."""

    state: StateValue
    questions: Questions


class DecisionsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`{model?, state, questions: {id: question}, states?: {name: {state, questions}}, options?}`.

    `questions` values stay raw JSON here; `parse_question` validates each one on its own.
    `state` may be omitted only when the request asks its questions through `states`.
    """

    state: StateValue | None = None
    questions: Questions = msgspec.field(default_factory=dict)
    states: dict[str, StateQuestions] | None = None
    model: str | None = None
    options: Options = msgspec.field(default_factory=Options)


def count_questions(request: DecisionsRequest) -> int:
    """How many questions a request asks, over all of its states (for request-size limits)."""
    return len(request.questions) + sum(len(s.questions) for s in (request.states or {}).values())


class DecisionAnswer(msgspec.Struct, omit_defaults=True):
    """One question's answer; fields not used by its type are omitted.

    choice: `choice`, `probabilities` {key: p}, `confidence`; noul: `noul` = P(true);
    score: `score` (the expected level, 1..n), `probabilities` {level: p}, `confidence`,
    `legend` {level: description}. A failed question has `error` only.
    """

    type: str | None = None
    choice: str | None = None
    noul: float | None = None
    score: float | None = None
    probabilities: dict[str, float] | None = None
    confidence: float | None = None
    legend: dict[str, str] | None = None
    error: ErrorBody | None = None


class StateAnswers(msgspec.Struct):
    answers: dict[str, DecisionAnswer]


class DecisionsResponse(msgspec.Struct, omit_defaults=True):
    """Answers keyed by question id, in question order; `states` mirrors the request's."""

    model: str
    answers: dict[str, DecisionAnswer]
    states: dict[str, StateAnswers] | None = None
    # A default_factory, so omit_defaults still writes `object` out.
    object: str = msgspec.field(default_factory=lambda: "decisions")
    meta: dict[str, Any] | None = None


# -- parsed forms ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DecisionOption:
    """One answer a question can take: a choice key, "true"/"false", or a level "1".."n"."""

    key: str
    description: str


@dataclass(frozen=True)
class Question:
    """A validated question. `options` are what the family scores, in answer order.

    For noul they are ("true", …) then ("false", …); `described` says which of the two the
    request described (an undescribed side has an empty description).
    """

    id: str
    type: QuestionType
    instructions: str
    options: tuple[DecisionOption, ...]
    described: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DecisionState:
    """A state in its three parts; `text` is what a model reads (see `render`)."""

    user: str
    answer: str
    context: str
    text: str


class QuestionInvalid(ValueError):
    """A question's field is wrong; the message starts with the field's path."""


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def parse_state(value: StateValue) -> DecisionState:
    """A state from its request form. A text state is all user part.

    An object renders as its context fields (`key: value` lines), then its user part, then
    its answer part after `Answer: `, so a model can tell what was asked from what was said.
    """
    if isinstance(value, str):
        return DecisionState(user=value, answer="", context="", text=value)
    user = "\n".join(_text_of(value[k]) for k in USER_FIELDS if k in value)
    answer = "\n".join(_text_of(value[k]) for k in ANSWER_FIELDS if k in value)
    context = "\n".join(
        f"{k}: {_text_of(v)}" for k, v in value.items() if k not in USER_FIELDS + ANSWER_FIELDS
    )
    parts = [context, user, f"Answer: {answer}" if answer else ""]
    return DecisionState(user=user, answer=answer, context=context, text="\n".join(p for p in parts if p))


def _text_field(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise QuestionInvalid(f"{path}: must be a non-empty string")
    return value.strip()


def _check_fields(raw: dict[str, Any], allowed: set[str], path: str, kind: str) -> None:
    for name in raw:
        if name not in allowed:
            known = ", ".join(sorted(allowed))
            raise QuestionInvalid(f"{path}.{name}: unknown field for {kind} (fields: {known})")


def _choice_options(raw: dict[str, Any], path: str) -> tuple[DecisionOption, ...]:
    if ("criteria" in raw) == ("choices" in raw):
        raise QuestionInvalid(f"{path}.criteria: a choice question takes exactly one of criteria or choices")
    if "criteria" in raw:
        criteria = raw["criteria"]
        if not isinstance(criteria, dict):
            raise QuestionInvalid(f"{path}.criteria: must be an object {{key: description}}")
        options = [
            DecisionOption(_text_field(k, f"{path}.criteria"), _text_field(v, f"{path}.criteria.{k}"))
            for k, v in criteria.items()
        ]
        field = "criteria"
    else:
        choices = raw["choices"]
        if not isinstance(choices, list):
            raise QuestionInvalid(f"{path}.choices: must be a list of {{key, description}}")
        options = []
        for i, entry in enumerate(choices):
            where = f"{path}.choices[{i}]"
            if not isinstance(entry, dict):
                raise QuestionInvalid(f"{where}: must be an object {{key, description}}")
            _check_fields(entry, {"key", "description"}, where, "a choice")
            key = _text_field(entry.get("key"), f"{where}.key")
            options.append(DecisionOption(key, _text_field(entry.get("description"), f"{where}.description")))
        field = "choices"
    if not MIN_CHOICES <= len(options) <= MAX_CHOICES:
        raise QuestionInvalid(
            f"{path}.{field}: a choice question takes {MIN_CHOICES} to {MAX_CHOICES} options; "
            f"got {len(options)}"
        )
    keys = [o.key for o in options]
    duplicate = next((k for k in keys if keys.count(k) > 1), None)
    if duplicate is not None:
        raise QuestionInvalid(f"{path}.{field}: the key {duplicate!r} appears twice")
    return tuple(options)


def _noul_options(raw: dict[str, Any], path: str) -> tuple[tuple[DecisionOption, ...], frozenset[str]]:
    criteria = raw.get("criteria", {})
    if not isinstance(criteria, dict):
        raise QuestionInvalid(f'{path}.criteria: must be an object {{"true": …, "false": …}}')
    _check_fields(criteria, {"true", "false"}, f"{path}.criteria", "a noul question")
    descriptions = {k: _text_field(v, f"{path}.criteria.{k}") for k, v in criteria.items()}
    options = tuple(DecisionOption(side, descriptions.get(side, "")) for side in ("true", "false"))
    return options, frozenset(descriptions)


def _score_options(raw: dict[str, Any], path: str) -> tuple[DecisionOption, ...]:
    levels = raw.get("levels")
    if not isinstance(levels, list):
        raise QuestionInvalid(f"{path}.levels: required, a list of level descriptions from lowest to highest")
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise QuestionInvalid(
            f"{path}.levels: a score question takes {MIN_LEVELS} to {MAX_LEVELS} levels; got {len(levels)}"
        )
    return tuple(
        DecisionOption(str(i + 1), _text_field(level, f"{path}.levels[{i}]"))
        for i, level in enumerate(levels)
    )


_FIELDS = {
    "choice": {"type", "instructions", "criteria", "choices"},
    "noul": {"type", "instructions", "criteria"},
    "score": {"type", "instructions", "levels"},
}


def parse_question(qid: str, raw: Any, path: str) -> Question:
    """Validate one raw question; `QuestionInvalid` names the first bad field under `path`."""
    if not isinstance(raw, dict):
        raise QuestionInvalid(f"{path}: must be an object {{type, instructions, …}}")
    qtype = raw.get("type")
    if qtype not in QUESTION_TYPES:
        raise QuestionInvalid(f"{path}.type: must be one of {', '.join(QUESTION_TYPES)}; got {qtype!r}")
    _check_fields(raw, _FIELDS[qtype], path, f"a {qtype} question")
    instructions = _text_field(raw.get("instructions"), f"{path}.instructions")
    described: frozenset[str] = frozenset()
    if qtype == "choice":
        options = _choice_options(raw, path)
    elif qtype == "noul":
        options, described = _noul_options(raw, path)
    else:
        options = _score_options(raw, path)
    return Question(id=qid, type=qtype, instructions=instructions, options=options, described=described)

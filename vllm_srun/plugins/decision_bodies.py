"""The `/v1/decisions` surface's request and response bodies, as the OpenAPI document shows them.

Bodies carry the upstream runtime's names (`DecisionRequest`, `DecisionResponse`, `Answer`...).
Questions stay raw JSON here; their parsed forms and `parse_question` are in decision_questions
(and importable from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from vllm_srun.plugins.bodies import ItemErrorCode, Options, ResponseMeta, Usage, options_type
from vllm_srun.plugins.decision_questions import (
    KNOWN_TYPES,
    MAX_CHOICES,
    MAX_LABELS,
    MAX_LEVELS,
    MIN_CHOICES,
    MIN_LABELS,
    MIN_LEVELS,
    QUESTION_TYPES,
    DecisionState,
    Question,
    QuestionInvalid,
    QuestionType,
    StateValue,
    expand_preset,
    parse_question,
    parse_state,
    select_state,
)

# -- questions as the OpenAPI document describes them ------------------------------------------
#
# A request's questions stay raw JSON until `parse_question` validates each one alone (so one
# bad question fails alone); these types say what it accepts, for the document and clients.

# What `_content` takes as text: a string with something other than whitespace in it.
Text = Annotated[str, msgspec.Meta(pattern=r"\S")]
# Instructions and descriptions: non-blank text, or a JSON object or array (read as its JSON).
Content = Text | dict[str, Any] | list[Any]
Unset = msgspec.UnsetType  # a field that may be left out, but not given as null
Over = Text | Annotated[list[Text], msgspec.Meta(min_length=1)]
Threshold = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class ChoiceOption(msgspec.Struct, forbid_unknown_fields=True):
    """One ordered option (`choices`, `labels`); a null or missing description reads the key."""

    key: Text
    description: Content | None = None


class _Common(msgspec.Struct, forbid_unknown_fields=True, tag_field="type"):
    """Fields every question takes: what it asks, the state fields it reads (`over`), and
    whether every supplied part must be read whole (`require_full_input`)."""

    instructions: Content
    over: Over | Unset = msgspec.UNSET
    require_full_input: bool | Unset = msgspec.UNSET


class ChoiceQuestion(_Common, tag="choice"):
    """Picks one option: exactly one of `criteria` ({key: description}) or `choices` (said
    here only: a JSON schema of a tagged union cannot say it)."""

    criteria: (
        Annotated[dict[Text, Content | None], msgspec.Meta(min_length=MIN_CHOICES, max_length=MAX_CHOICES)]
        | Unset
    ) = msgspec.UNSET
    choices: (
        Annotated[list[ChoiceOption], msgspec.Meta(min_length=MIN_CHOICES, max_length=MAX_CHOICES)] | Unset
    ) = msgspec.UNSET


class NoulCriteria(msgspec.Struct, forbid_unknown_fields=True):
    """What "true" and "false" mean; either may be left out (or null: the model's default)."""

    true: Content | Unset | None = msgspec.UNSET
    false: Content | Unset | None = msgspec.UNSET


class NoulQuestion(_Common, tag="noul"):
    """P(true); `criteria` or the ordered `choices` (keys `true` and `false` only) describe the
    sides."""

    criteria: NoulCriteria | Unset = msgspec.UNSET
    choices: Annotated[list[ChoiceOption], msgspec.Meta(max_length=2)] | Unset = msgspec.UNSET


Levels = Annotated[list[Content], msgspec.Meta(min_length=MIN_LEVELS, max_length=MAX_LEVELS)]


class ScoreQuestion(_Common, tag="score"):
    """Levels from lowest to highest: exactly one of `criteria` (a list) or `levels`."""

    criteria: Levels | Unset = msgspec.UNSET
    levels: Levels | Unset = msgspec.UNSET


class SetQuestion(_Common, tag="set"):
    """Of each label, whether it holds: exactly one of `criteria` ({label: description}) or the
    ordered `labels`; `threshold` selects (default `defaults.SET_THRESHOLD`)."""

    criteria: (
        Annotated[dict[Text, Content | None], msgspec.Meta(min_length=MIN_LABELS, max_length=MAX_LABELS)]
        | Unset
    ) = msgspec.UNSET
    labels: (
        Annotated[list[ChoiceOption], msgspec.Meta(min_length=MIN_LABELS, max_length=MAX_LABELS)] | Unset
    ) = msgspec.UNSET
    threshold: Threshold | Unset = msgspec.UNSET


QuestionBody = ChoiceQuestion | NoulQuestion | ScoreQuestion | SetQuestion


class PresetQuestion(msgspec.Struct, forbid_unknown_fields=True):
    """A question the model defines (its card's `presets`); the model fills in its type,
    instructions and criteria. `type`, if given, must be the preset's; `threshold` applies to
    a set preset; `over` as any question's."""

    preset: Text
    type: QuestionType | Unset = msgspec.UNSET
    threshold: Threshold | Unset = msgspec.UNSET
    over: Over | Unset = msgspec.UNSET


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


def _question_schema() -> dict[str, Any]:
    typed = _inlined(QuestionBody)
    # One of: each typed question has its own `type` and `instructions`, which a preset question
    # (no `instructions`, its own fields only) cannot have, so no question matches two.
    return {"oneOf": [*typed["anyOf"], _inlined(PresetQuestion)]}


# `questions` as the document shows it: {id: a choice, noul, score or set question, or a preset}.
Questions = Annotated[
    dict[str, Any],
    msgspec.Meta(extra_json_schema={"additionalProperties": _question_schema()}),
]
# Images every question of a state sees: a model kind (image modality) not served here; a
# non-empty list is refused with invalid_request naming the field.
Images = list[str]


class StateQuestions(msgspec.Struct, forbid_unknown_fields=True):
    """One named extra state of a request and the questions asked about it."""

    state: StateValue
    questions: Questions
    images: Images | None = None


# Upstream names this entry `DecisionState`, the name our parsed state (which families write
# against) had first; the document names a component by its class's name, so the entry's
# class carries upstream's name there.
StateQuestions.__qualname__ = StateQuestions.__name__ = "DecisionState"


# The options the decisions surface reads: the request-wide ones; `max_tokens`, a scan budget,
# taken only by a model whose card has `limits.max_scan_tokens` (one that reads a long state part
# in windows); `overflow`, what a state too long for one input becomes. Its own closed type, as
# every surface's (`options_type`): the document lists only these.
DECISIONS_OPTIONS = frozenset({"return_meta", "deadline_ms", "profile", "max_tokens", "overflow"})

if TYPE_CHECKING:
    RequestOptions = Options
else:
    RequestOptions = options_type(
        "RequestOptions",
        DECISIONS_OPTIONS,
        "The decisions surface's options (upstream's RequestOptions; see Options).",
    )


class DecisionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`{model?, state, questions: {id: question}, images?, states?: {name: {state, questions}},
    options?}`.

    `questions` values stay raw JSON here; `parse_question` validates each one on its own.
    `state` may be omitted only when the request asks its questions through `states`.
    """

    state: StateValue | None = None
    questions: Questions = msgspec.field(default_factory=dict)
    images: Images | None = None
    states: dict[str, StateQuestions] | None = None
    model: str | None = None
    options: RequestOptions = msgspec.field(default_factory=RequestOptions)


def count_questions(request: DecisionRequest) -> int:
    """How many questions a request asks, over all of its states (for request-size limits)."""
    return len(request.questions) + sum(len(s.questions) for s in (request.states or {}).values())


class Answer(msgspec.Struct, omit_defaults=True):
    """One question's answer; fields not used by its type are omitted.

    choice: `choice`, `probabilities` {key: p}, `confidence`; noul: `noul` = P(true);
    score: `score` (the expected level, 0..n-1), `probabilities` {level: p}, `confidence`,
    `legend` {level: description}. A failed question has only `type` (null when it named no
    known type), `error` (an ItemError code) and `message`. `input_coverage` is "complete" on
    an answered `require_full_input` question.
    """

    type: str | None
    choice: str | None = None
    noul: float | None = None
    score: float | None = None
    probabilities: dict[str, float] | None = None
    confidence: float | None = None
    legend: dict[str, str] | None = None
    input_coverage: Literal["complete"] | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class SetAnswer(msgspec.Struct, omit_defaults=True):
    """A set question's labels over its threshold (in label order) and every label's P(holds)."""

    selected: list[str]
    probabilities: dict[str, float]
    input_coverage: Literal["complete"] | None = None


class DecisionStateResponse(msgspec.Struct, omit_defaults=True):
    """The answers about one entry of a request's `states`, as its own request would get them;
    `usage` counts that state alone."""

    model: str
    answers: dict[str, Answer]
    usage: Usage
    sets: dict[str, SetAnswer] | None = None
    thresholds: dict[str, float] | None = None
    meta: ResponseMeta | None = None


class DecisionResponse(msgspec.Struct, omit_defaults=True):
    """Answers keyed by question id, in question order; a set question answers `sets[id]`,
    `thresholds[id]` and a noul answer per label under `answers["<id>.<label>"]`. `usage`
    counts the request's own `state`; `states` mirrors the request's."""

    model: str
    answers: dict[str, Answer]
    usage: Usage
    sets: dict[str, SetAnswer] | None = None
    thresholds: dict[str, float] | None = None
    states: dict[str, DecisionStateResponse] | None = None
    # A default_factory, so omit_defaults still writes `object` out.
    object: str = msgspec.field(default_factory=lambda: "decisions")
    meta: ResponseMeta | None = None


# Earlier names of these bodies, for code written against them.
DecisionsRequest = DecisionRequest
DecisionsResponse = DecisionResponse
DecisionAnswer = Answer


# The surface's public names, with the parsed forms re-exported for code that imports them here.
__all__ = [
    "DECISIONS_OPTIONS",
    "KNOWN_TYPES",
    "MAX_CHOICES",
    "MAX_LEVELS",
    "MIN_CHOICES",
    "MIN_LEVELS",
    "QUESTION_TYPES",
    "Answer",
    "ChoiceOption",
    "ChoiceQuestion",
    "Content",
    "DecisionAnswer",
    "DecisionRequest",
    "DecisionResponse",
    "DecisionState",
    "DecisionStateResponse",
    "DecisionsRequest",
    "DecisionsResponse",
    "Images",
    "Levels",
    "NoulCriteria",
    "NoulQuestion",
    "Over",
    "PresetQuestion",
    "Question",
    "QuestionBody",
    "QuestionInvalid",
    "Questions",
    "ScoreQuestion",
    "SetAnswer",
    "SetQuestion",
    "StateQuestions",
    "StateValue",
    "Text",
    "Threshold",
    "Unset",
    "count_questions",
    "expand_preset",
    "parse_question",
    "parse_state",
    "select_state",
]

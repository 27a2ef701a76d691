"""Questions and states of the `/v1/decisions` surface in parsed form, and their limits.

A question is decoded raw and validated alone (`parse_question`), so a bad one fails alone
with `QuestionInvalid` naming the field. A state is a text, a JSON object (`request`/`user`/
`prompt` the user part, `answer`/`response` the answer, the rest context) or an array;
`select_state` picks what a question's `over` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

# The question types. `choice` picks one of several keyed options. `noul` (read "no/yes") is a
# yes/no question: its answer is one number, `noul` = P(true), the probability that the
# instructions hold of the state; its optional criteria describe what "true" and "false" mean.
# `score` rates the state on levels 0..n-1 and answers their expected value. `set` asks, of
# each of 1..255 labels, whether it holds (several may), and selects those over a threshold.
# `span` (labelled text spans) is upstream's too, for models with a span head; a family
# answers the types it declares (`DecisionModel.question_types`), the others fail alone.
QuestionType = Literal["choice", "noul", "score", "set", "span"]
QUESTION_TYPES: tuple[str, ...] = ("choice", "noul", "score")
LABELLED_TYPES: tuple[str, ...] = ("set", "span")
KNOWN_TYPES: tuple[str, ...] = QUESTION_TYPES + LABELLED_TYPES

MIN_CHOICES, MAX_CHOICES = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MIN_LABELS, MAX_LABELS = 1, 255
NOUL_KEYS = ("true", "false")
USER_FIELDS = ("request", "user", "prompt")
ANSWER_FIELDS = ("answer", "response")
PARTS = ("user", "answer", "context")

StateValue = str | dict[str, Any] | list[Any]


# -- parsed forms ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DecisionOption:
    """One answer a question can take: a choice key, "true"/"false", a level "0".."n-1" or a
    set label."""

    key: str
    description: str


@dataclass(frozen=True)
class Question:
    """A validated question. `options` are what the family scores, in answer order.

    For noul they are ("true", …) then ("false", …); `described` says which of the two the
    request described (an undescribed side has an empty description). For set they are the
    labels; `threshold` is the request's (None: the family's default). `over` names the state
    fields or parts the question reads (None: the whole state); `preset` the model's question
    it was filled from.
    """

    id: str
    type: str
    instructions: str
    options: tuple[DecisionOption, ...]
    described: frozenset[str] = frozenset()
    threshold: float | None = None
    over: tuple[str, ...] | None = None
    require_full_input: bool = False
    preset: str | None = None


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
    """A state from its request form. A text state (or an array, as its JSON) is all user part.

    An object renders as its context fields (`key: value` lines), then its user part, then
    its answer part after `Answer: `, so a model can tell what was asked from what was said.
    """
    if not isinstance(value, dict):
        text = _text_of(value)
        return DecisionState(user=text, answer="", context="", text=text)
    user = "\n".join(_text_of(value[k]) for k in USER_FIELDS if k in value)
    answer = "\n".join(_text_of(value[k]) for k in ANSWER_FIELDS if k in value)
    context = "\n".join(
        f"{k}: {_text_of(v)}" for k, v in value.items() if k not in USER_FIELDS + ANSWER_FIELDS
    )
    parts = [context, user, f"Answer: {answer}" if answer else ""]
    return DecisionState(user=user, answer=answer, context=context, text="\n".join(p for p in parts if p))


def _part_of(key: str) -> str:
    return "user" if key in USER_FIELDS else "answer" if key in ANSWER_FIELDS else "context"


def select_state(value: StateValue, over: tuple[str, ...] | None, path: str) -> tuple[StateValue, bool]:
    """The part of a state a question reads, and whether that is all of it.

    `over` names state fields, or parts (`user`, `answer`, `context`; a user or answer field
    name the state lacks stands for its part). A text or array state is one field, `request`,
    in the user part.
    """
    if over is None:
        return value, True
    if not isinstance(value, dict):
        for name in over:
            if name not in ("request", "user"):
                raise QuestionInvalid(
                    f"{path}.over: {name!r} is not a field of the state (a text state is 'request')"
                )
        return value, True
    keys: set[str] = set()
    for name in over:
        if name in value:
            keys.add(name)
            continue
        part = name if name in PARTS else _part_of(name) if name in USER_FIELDS + ANSWER_FIELDS else None
        matched = {k for k in value if part is not None and _part_of(k) == part}
        if not matched:
            raise QuestionInvalid(f"{path}.over: {name!r} is not a field or part of the state")
        keys |= matched
    return {k: v for k, v in value.items() if k in keys}, len(keys) == len(value)


def _content(value: Any, path: str, *, nullable: bool = False) -> str | None:
    """Non-blank text (stripped), or a JSON object or array as its JSON text; None where
    `nullable`."""
    if value is None and nullable:
        return None
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, (dict, list)) and value:
        return _text_of(value)
    raise QuestionInvalid(f"{path}: must be non-blank text, an object or an array")


def _key(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise QuestionInvalid(f"{path}: must be a non-empty string")
    return value.strip()


def _check_fields(raw: dict[str, Any], allowed: set[str], path: str, kind: str) -> None:
    for name in raw:
        if name not in allowed:
            known = ", ".join(sorted(allowed))
            raise QuestionInvalid(f"{path}.{name}: unknown field for {kind} (fields: {known})")


def _one_of(raw: dict[str, Any], mapping: str, ordered: str, path: str, kind: str) -> str:
    """Which of `criteria` or its ordered form a question gives; exactly one."""
    if (mapping in raw) == (ordered in raw):
        raise QuestionInvalid(
            f"{path}.{mapping}: a {kind} question takes exactly one of {mapping} or {ordered}"
        )
    return mapping if mapping in raw else ordered


def _named(criteria: Any, path: str) -> list[DecisionOption]:
    """`{key: description}` in order; a null description reads the key."""
    if not isinstance(criteria, dict):
        raise QuestionInvalid(f"{path}: must be an object {{key: description}}")
    return [
        DecisionOption(k := _key(key, path), _content(value, f"{path}.{key}", nullable=True) or k)
        for key, value in criteria.items()
    ]


def _listed(entries: Any, path: str, keys: tuple[str, ...] | None = None) -> list[DecisionOption]:
    """`[{key, description}]` in order; a null or missing description reads the key."""
    if not isinstance(entries, list):
        raise QuestionInvalid(f"{path}: must be a list of {{key, description}}")
    options = []
    for i, entry in enumerate(entries):
        where = f"{path}[{i}]"
        if not isinstance(entry, dict):
            raise QuestionInvalid(f"{where}: must be an object {{key, description}}")
        _check_fields(entry, {"key", "description"}, where, "an option")
        key = _key(entry.get("key"), f"{where}.key")
        if keys is not None and key not in keys:
            raise QuestionInvalid(f"{where}.key: must be one of {', '.join(keys)}; got {key!r}")
        options.append(
            DecisionOption(
                key, _content(entry.get("description"), f"{where}.description", nullable=True) or key
            )
        )
    return options


def _counted(
    options: list[DecisionOption], path: str, kind: str, low: int, high: int
) -> tuple[DecisionOption, ...]:
    if not low <= len(options) <= high:
        raise QuestionInvalid(f"{path}: a {kind} question takes {low} to {high} options; got {len(options)}")
    keys = [o.key for o in options]
    duplicate = next((k for k in keys if keys.count(k) > 1), None)
    if duplicate is not None:
        raise QuestionInvalid(f"{path}: the key {duplicate!r} appears twice")
    return tuple(options)


def _choice_options(raw: dict[str, Any], path: str) -> tuple[DecisionOption, ...]:
    field = _one_of(raw, "criteria", "choices", path, "choice")
    where = f"{path}.{field}"
    options = _named(raw[field], where) if field == "criteria" else _listed(raw[field], where)
    return _counted(options, where, "choice", MIN_CHOICES, MAX_CHOICES)


def _noul_options(raw: dict[str, Any], path: str) -> tuple[tuple[DecisionOption, ...], frozenset[str]]:
    if "criteria" in raw and "choices" in raw:
        raise QuestionInvalid(f"{path}.criteria: a noul question takes at most one of criteria or choices")
    descriptions: dict[str, str | None] = {}
    if "choices" in raw:
        where = f"{path}.choices"
        listed = _counted(_listed(raw["choices"], where, NOUL_KEYS), where, "noul", 0, 2)
        given = {e["key"]: e.get("description") for e in raw["choices"]}
        descriptions = {o.key: o.description if given[o.key] is not None else None for o in listed}
    else:
        criteria = raw.get("criteria", {})
        if not isinstance(criteria, dict):
            raise QuestionInvalid(f'{path}.criteria: must be an object {{"true": …, "false": …}}')
        _check_fields(criteria, set(NOUL_KEYS), f"{path}.criteria", "a noul question")
        descriptions = {k: _content(v, f"{path}.criteria.{k}", nullable=True) for k, v in criteria.items()}
    described = {k: v for k, v in descriptions.items() if v is not None}
    options = tuple(DecisionOption(side, described.get(side, "")) for side in NOUL_KEYS)
    return options, frozenset(described)


def _score_options(raw: dict[str, Any], path: str) -> tuple[DecisionOption, ...]:
    if "criteria" not in raw and "levels" not in raw:
        raise QuestionInvalid(f"{path}.levels: required, a list of level descriptions from lowest to highest")
    field = _one_of(raw, "criteria", "levels", path, "score")
    levels = raw[field]
    if not isinstance(levels, list):
        raise QuestionInvalid(f"{path}.{field}: must be a list of level descriptions from lowest to highest")
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise QuestionInvalid(
            f"{path}.{field}: a score question takes {MIN_LEVELS} to {MAX_LEVELS} levels; got {len(levels)}"
        )
    return tuple(
        DecisionOption(str(i), _content(level, f"{path}.{field}[{i}]") or "")
        for i, level in enumerate(levels)
    )


def _set_options(raw: dict[str, Any], path: str) -> tuple[DecisionOption, ...]:
    field = _one_of(raw, "criteria", "labels", path, "set")
    where = f"{path}.{field}"
    options = _named(raw[field], where) if field == "criteria" else _listed(raw[field], where)
    return _counted(options, where, "set", MIN_LABELS, MAX_LABELS)


def _threshold(raw: dict[str, Any], path: str) -> float | None:
    value = raw.get("threshold")
    if value is None and "threshold" not in raw:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise QuestionInvalid(f"{path}.threshold: must be a number in [0, 1]")
    return float(value)


def _over(raw: dict[str, Any], path: str) -> tuple[str, ...] | None:
    if "over" not in raw:
        return None
    value = raw["over"]
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise QuestionInvalid(f"{path}.over: must be a state field name or a non-empty list of them")
    return tuple(n.strip() for n in names)


_FIELDS = {
    "choice": {"criteria", "choices"},
    "noul": {"criteria", "choices"},
    "score": {"criteria", "levels"},
    "set": {"criteria", "labels", "threshold"},
}
_COMMON = {"type", "instructions", "over", "require_full_input", "preset"}
# Fields upstream defines that only a model kind not served here reads: named in the error.
_UNREAD = {
    "overflow": "only a model with a scan budget (its card's limits.max_scan_tokens) reads it",
    "head": "only span questions on a model with a broad span head take it",
}


def parse_question(
    qid: str, raw: Any, path: str, *, types: tuple[str, ...] = (*QUESTION_TYPES, "set")
) -> Question:
    """Validate one raw question; `QuestionInvalid` names the first bad field under `path`.

    `types` are the question types the model answers; a known type outside them fails too.
    """
    if not isinstance(raw, dict):
        raise QuestionInvalid(f"{path}: must be an object {{type, instructions, …}}")
    qtype = raw.get("type")
    if qtype not in KNOWN_TYPES:
        raise QuestionInvalid(f"{path}.type: must be one of {', '.join(KNOWN_TYPES)}; got {qtype!r}")
    if qtype not in types:
        raise QuestionInvalid(
            f"{path}.type: this model answers {', '.join(types)} questions only; not {qtype}"
        )
    for name, why in _UNREAD.items():
        if name in raw:
            raise QuestionInvalid(f"{path}.{name}: {why}")
    _check_fields(raw, _FIELDS[qtype] | _COMMON, path, f"a {qtype} question")
    instructions = _content(raw.get("instructions"), f"{path}.instructions") or ""
    full = raw.get("require_full_input", False)
    if not isinstance(full, bool):
        raise QuestionInvalid(f"{path}.require_full_input: must be a boolean")
    described: frozenset[str] = frozenset()
    if qtype == "choice":
        options = _choice_options(raw, path)
    elif qtype == "noul":
        options, described = _noul_options(raw, path)
    elif qtype == "score":
        options = _score_options(raw, path)
    else:
        options = _set_options(raw, path)
    return Question(
        id=qid,
        type=qtype,
        instructions=instructions,
        options=options,
        described=described,
        threshold=_threshold(raw, path),
        over=_over(raw, path),
        require_full_input=full,
        preset=raw.get("preset"),
    )


# What a preset question may say beside its name: the rest the preset defines.
_PRESET_KEEPS = ("type", "threshold", "over", "require_full_input")


def expand_preset(raw: Any, presets: dict[str, dict[str, Any]], path: str) -> Any:
    """A preset question as the question the model defines under that name; any other raw
    question as it is. A preset question takes only `preset`, `type` (the preset's own),
    `threshold`, `over` and `require_full_input` (what any question may say of how it reads
    the state); anything else fails naming it."""
    if not isinstance(raw, dict) or "preset" not in raw:
        return raw
    name = raw["preset"]
    if name not in presets:
        known = ", ".join(sorted(presets)) or "none"
        raise QuestionInvalid(f"{path}.preset: {name!r} is not a preset of this model (presets: {known})")
    extra = sorted(set(raw) - {"preset", *_PRESET_KEEPS})
    if extra:
        raise QuestionInvalid(
            f"{path}.{extra[0]}: a preset question takes only preset, type, threshold, over and "
            "require_full_input; "
            f"the preset fills in the rest (got {', '.join(extra)})"
        )
    defined = presets[name]
    if raw.get("type", defined["type"]) != defined["type"]:
        raise QuestionInvalid(f"{path}.type: preset {name!r} is a {defined['type']} question")
    if "threshold" in raw and defined["type"] != "set":
        raise QuestionInvalid(f"{path}.threshold: preset {name!r} is a {defined['type']} question, not a set")
    kept = {k: raw[k] for k in _PRESET_KEEPS if k in raw and k != "type"}
    return {**defined, **kept, "preset": name}

"""Request and response bodies of the HTTP surfaces.

They live on the plugin side because families plan from requests and finish into responses;
the app only decodes and encodes them. Requests reject unknown fields, so a misspelled
option is an error naming it instead of being ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from vllm_srun.errors import InvalidRequest

SURFACES = ("classify", "embeddings", "rerank", "decisions")

Overflow = Literal["reject", "truncate", "window"]


class WindowOptions(msgspec.Struct, forbid_unknown_fields=True):
    tokens: Annotated[int, msgspec.Meta(ge=2)]
    overlap: Annotated[int, msgspec.Meta(ge=0)] = 0


class Options(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Options every surface takes; a family ignores those that do not apply to it."""

    return_meta: bool = False
    overflow: Overflow = "reject"
    window: WindowOptions | None = None
    threshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    return_tokens: bool = False
    head: str | None = None
    deadline_ms: Annotated[int, msgspec.Meta(gt=0)] | None = None


class TextPair(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    text_pair: str | None = None


class ClassifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    input: str | TextPair | Annotated[list[str | TextPair], msgspec.Meta(min_length=1)]
    model: str | None = None
    options: Options = msgspec.field(default_factory=Options)


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI-compatible: `input`, `model`, `encoding_format`, `dimensions`, `user`."""

    input: str | Annotated[list[str], msgspec.Meta(min_length=1)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None
    options: Options = msgspec.field(default_factory=Options)


class RerankDocument(msgspec.Struct, forbid_unknown_fields=True):
    text: str


class RerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    documents: Annotated[list[str | RerankDocument], msgspec.Meta(min_length=1)]
    model: str | None = None
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool = False
    options: Options = msgspec.field(default_factory=Options)


# Responses. Fields left at their default are omitted from the JSON, except `object`.


def _always(value: str) -> Any:
    """A default that omit_defaults still writes out (msgspec skips only plain defaults)."""
    return msgspec.field(default_factory=lambda: value)


class ErrorBody(msgspec.Struct):
    code: str
    message: str


class InputInfo(msgspec.Struct):
    tokens: int
    processed_tokens: int
    truncated: bool = False
    windows: int = 1


class Span(msgspec.Struct, omit_defaults=True):
    label: str
    start: int
    end: int
    text: str
    score: float


class ClassifyResult(msgspec.Struct, omit_defaults=True):
    index: int
    label: str | None = None
    score: float | None = None
    probabilities: list[float] | None = None
    selected: list[str] | None = None
    spans: list[Span] | None = None
    tokens: list[dict[str, Any]] | None = None
    input: InputInfo | None = None
    error: ErrorBody | None = None


class ClassifyResponse(msgspec.Struct, omit_defaults=True):
    model: str
    head: str
    labels: list[str]
    results: list[ClassifyResult]
    object: str = _always("classification")
    meta: dict[str, Any] | None = None


class EmbeddingData(msgspec.Struct, omit_defaults=True):
    index: int
    embedding: list[float] | str | None = None
    object: str = _always("embedding")
    input: InputInfo | None = None
    error: ErrorBody | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(msgspec.Struct, omit_defaults=True):
    data: list[EmbeddingData]
    model: str
    usage: Usage
    object: str = _always("list")
    meta: dict[str, Any] | None = None


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float | None = None
    logit: float | None = None
    document: RerankDocument | None = None
    input: InputInfo | None = None
    error: ErrorBody | None = None


class RerankResponse(msgspec.Struct, omit_defaults=True):
    model: str
    results: list[RerankResult]
    usage: Usage
    object: str = _always("rerank")
    meta: dict[str, Any] | None = None


def texts_of(value: str | TextPair | list[str | TextPair]) -> list[TextPair]:
    """Classify input in its one general form: a list of (text, optional pair)."""
    values = value if isinstance(value, list) else [value]
    return [TextPair(text=v) if isinstance(v, str) else v for v in values]


def request_type(surface: str) -> type[Any]:
    """The request Struct of a surface (for bulk job lines and recorded golden requests)."""
    from vllm_srun.plugins.decision_surface import DecisionsRequest  # it imports this module

    types: dict[str, type[Any]] = {
        "classify": ClassifyRequest,
        "embeddings": EmbeddingsRequest,
        "rerank": RerankRequest,
        "decisions": DecisionsRequest,
    }
    if surface not in types:
        raise InvalidRequest(f"surface: {surface!r} is not one of {', '.join(types)}")
    return types[surface]

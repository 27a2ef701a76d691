"""The request and response bodies of the surfaces that `plan_surface` takes and `finish_surface` gives.

Requests reject unknown fields, so a misspelled option is an error naming it; each surface's
options type is made from the option names it reads. Responses omit fields left at their
default, except `object`; a failed item carries `error` and `message` in place of its result.
`vllm_srun.plugins.surfaces` re-exports every name here beside the descriptors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import msgspec

from vllm_srun.errors import InvalidRequest
from vllm_srun.plugins.bodies import (
    ItemErrorCode,
    Options,
    ResponseMeta,
    UnsupportedOption,
    Usage,
    options_type,
)

# The options each surface reads: every surface takes the request-wide ones; the rest belong to
# the surfaces whose results they shape. Each surface's options type is made from its names
# (`options_type`), so what it decodes, what the document says and what its descriptor lists
# are one set. Typed as `Options` for the families, which read every surface's options alike.
_COMMON_OPTIONS = frozenset({"return_meta", "deadline_ms", "profile"})
_INPUT_OPTIONS = _COMMON_OPTIONS | {"overflow", "truncation_direction", "window", "max_tokens", "head"}
CLASSIFY_OPTIONS = _INPUT_OPTIONS | {"threshold", "return_tokens", "return_logits"}
EMBEDDINGS_OPTIONS = _INPUT_OPTIONS | {"normalize", "output", "embedding_type", "late_chunking"}
RERANK_OPTIONS = _INPUT_OPTIONS | {"output"}

if TYPE_CHECKING:
    ClassifyOptions = Options
    EmbeddingsOptions = Options
    RerankOptions = Options
else:
    ClassifyOptions = options_type(
        "ClassifyOptions", CLASSIFY_OPTIONS, "The options of classify (see Options)."
    )
    EmbeddingsOptions = options_type(
        "EmbeddingsOptions", EMBEDDINGS_OPTIONS, "The options of embeddings (see Options)."
    )
    # Rerank scores by a dense vector or, MaxSim, by token vectors: those two kinds only.
    RerankOptions = options_type(
        "RerankOptions",
        RERANK_OPTIONS,
        "The options of rerank (see Options).",
        narrowed={"output": Literal["dense", "multi_vector"] | None},
    )


class ClassifyItem(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One classify input in object form: a text, or a pair `{text, text_pair}`. Upstream's
    grounded `{context, question, answer}` items need a grounded head, which no family here
    has: they are refused naming the field (see `texts_of`). `text` decodes as optional so that
    a grounded item gets that message, but every item needs it: the document says so."""

    schema_required: ClassVar[tuple[str, ...]] = ("text",)

    text: str | None = None
    text_pair: str | None = None
    context: str | None = None
    question: str | None = None
    answer: str | None = None


# The name plugins written before upstream's ClassifyItem import.
TextPair = ClassifyItem

ClassifyInput = str | ClassifyItem | Annotated[list[str | ClassifyItem], msgspec.Meta(min_length=1)]


class ClassifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    input: ClassifyInput
    model: str | None = None
    head: str | None = None
    options: ClassifyOptions = msgspec.field(default_factory=ClassifyOptions)

    def head_name(self) -> str | None:
        """The head asked for: `head`, or its alias `options.head`; both, and different, is a 400."""
        if self.head is not None and self.options.head is not None and self.head != self.options.head:
            raise InvalidRequest(
                f"head: {self.head!r} differs from options.head {self.options.head!r}; give one of them",
                param="head",
            )
        return self.head if self.head is not None else self.options.head


TokenIds = Annotated[list[int], msgspec.Meta(min_length=1)]


class ImagePart(msgspec.Struct, forbid_unknown_fields=True):
    url: str


class AudioPart(msgspec.Struct, forbid_unknown_fields=True):
    data: str
    format: str | None = None


class ContentPart(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Upstream's embeddings input part: `{type: text, text}` is a text like any other; image
    and audio parts need a model with that modality, which no family here has, so they are
    refused naming the part (see `EmbeddingsRequest.inputs`). Each part needs the field its
    `type` names (the document's `oneOf`)."""

    required_by_tag: ClassVar[tuple[str, dict[str, str]]] = (
        "type",
        {"text": "text", "image_url": "image_url", "input_audio": "input_audio"},
    )

    type: Literal["text", "image_url", "input_audio"]
    text: str | None = None
    image_url: ImagePart | None = None
    input_audio: AudioPart | None = None


def _part_text(part: ContentPart, index: int) -> str:
    where = f"input[{index}]"
    if part.type != "text":
        modality = "image" if part.type == "image_url" else "audio"
        raise UnsupportedOption(  # a modality the models here lack: their refusal, 422
            f"{where}.{part.type}: {modality} input needs a model with the {modality} modality; the "
            "models here read text",
            param=f"{where}.{part.type}",
        )
    if part.text is None:
        raise InvalidRequest(f"{where}.text: a text part needs its text", param=f"{where}.text")
    return part.text


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI-compatible: `input` (a text, a list of texts, a list of token ids or a list of
    token-id lists; upstream's text content parts too), `model`, `encoding_format`,
    `dimensions`, `user` (accepted, not used).

    A sentence-transformers prompt is chosen by `prompt_name` (TEI's field), by `input_type`
    (the upstream runtime's: the package's "query" or "document" prompt) or given as a raw
    `prompt`; with none of them the package's `default_prompt_name` applies. Token ids are taken
    as given: no prompt and no special tokens are added to them.

    The document says what decoding cannot (msgspec takes one list type in a union, and
    `inputs` refuses the rest): `input` is one of a text, texts and text parts, token ids, or
    lists of token ids, never a mix; and at most one of `prompt`, `prompt_name` and
    `input_type` is given (null counts as not given).

    `late_chunking` (Jina's field; `options.late_chunking` is its alias, and both given must
    agree) makes the texts the chunks of one document, in order: the document is encoded once
    and each chunk's vector is pooled from its own tokens' states in it (docs/api: late
    chunking). Its chunks are texts, none without tokens, the whole document within the
    model's token limit, read whole (not `options.overflow: "window"`) into dense vectors.
    """

    schema_properties: ClassVar[dict[str, Any]] = {
        "input": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"anyOf": [{"type": "string"}, {"$ref": "#/components/schemas/ContentPart"}]},
                },
                {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}},
                },
            ]
        }
    }
    schema_at_most_one: ClassVar[tuple[str, ...]] = ("prompt", "prompt_name", "input_type")

    input: str | Annotated[list[str | int | TokenIds | ContentPart], msgspec.Meta(min_length=1)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    layer: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None
    prompt_name: str | None = None
    input_type: Literal["query", "document"] | None = None
    prompt: str | None = None
    late_chunking: bool | None = None
    options: EmbeddingsOptions = msgspec.field(default_factory=EmbeddingsOptions)

    def late_chunked(self) -> bool:
        """Whether `late_chunking` or its alias `options.late_chunking` asks for late chunking;
        both given, and different, is a 400."""
        top, option = self.late_chunking, self.options.late_chunking
        if top is not None and option is not None and top != option:
            raise InvalidRequest(
                f"late_chunking: {str(top).lower()} differs from options.late_chunking "
                f"{str(option).lower()}; give one of them",
                param="late_chunking",
            )
        return bool(top if top is not None else option)

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text or a list of token ids (a flat list of ids is one input). A list
        mixing the forms is an InvalidRequest naming `input`; so is an image or audio part."""
        if isinstance(self.input, str):
            return [self.input]
        value = [_part_text(v, i) if isinstance(v, ContentPart) else v for i, v in enumerate(self.input)]
        if all(isinstance(v, int) for v in value):
            return [[v for v in value if isinstance(v, int)]]
        if any(isinstance(v, int) for v in value):
            raise InvalidRequest(
                "input: a list of token ids must hold only ids; give several inputs as a list of lists",
                param="input",
            )
        if any(isinstance(v, str) for v in value) and any(isinstance(v, list) for v in value):
            # As OpenAI: texts or token-id lists, not both (a default prompt applies to texts only).
            raise InvalidRequest("input: give texts or lists of token ids, not both", param="input")
        return [v for v in value if not isinstance(v, int)]


class RerankDocument(msgspec.Struct, forbid_unknown_fields=True):
    """A document as an object (Cohere's and TEI's clients send these); upstream sends strings."""

    text: str


class RerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    """`layer` and `dimensions` name the pair scorer's exit; a model here serves one exit (its
    last layer, at its own dimension), so any other is a 400 naming the field.

    `prompt_name` (one of the package's sentence-transformers prompts) or a raw `prompt`, at
    most one of them, is applied to each pair as `CrossEncoder.predict(prompt_name=...,
    prompt=...)` applies it: a cross-encoder puts it before the query, a LogitScore package
    renders it through its chat template as the instruction; without either the package's
    `default_prompt_name` applies. A bi-encoder (the query and documents embedded apart)
    refuses them (422)."""

    schema_at_most_one: ClassVar[tuple[str, ...]] = ("prompt", "prompt_name")

    query: str
    documents: Annotated[list[str | RerankDocument], msgspec.Meta(min_length=1)]
    model: str | None = None
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool = False
    layer: Annotated[int, msgspec.Meta(ge=1)] | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    options: RerankOptions = msgspec.field(default_factory=RerankOptions)


# Responses: a failed item carries `error` (upstream's ItemError code) and `message`.


def _always(value: str) -> Any:
    """A default that omit_defaults still writes out (msgspec skips only plain defaults)."""
    return msgspec.field(default_factory=lambda: value)


class InputUsage(msgspec.Struct):
    """Tokenizer facts of one input, special tokens included. `processed_tokens` counts what the
    model read (a token in two windows once per window); the whole input is always tokenized,
    so `tokens` is exact and `tokens_lower_bound` false."""

    tokens: int
    processed_tokens: int
    truncated: bool
    tokens_lower_bound: bool = False
    windows: int = 1


class Span(msgspec.Struct, omit_defaults=True):
    """A labelled span: code-point offsets into the input text, end exclusive."""

    label: str
    start: int
    end: int
    text: str
    probability: float


class TokenProbabilities(msgspec.Struct, omit_defaults=True):
    """One token's label probabilities (`options.return_tokens`), in the response's label order;
    `token` and the most probable `label` are ours."""

    start: int
    end: int
    probabilities: list[float]
    token: str | None = None
    label: str | None = None


class ClassifyWindow(msgspec.Struct, omit_defaults=True):
    """One window of a windowed input: content-token offsets of the windowed text (end
    exclusive), and the window's own `probabilities` (sequence heads) or `scores`."""

    start: int
    end: int
    probabilities: list[float] | None = None
    scores: list[float] | None = None


ClassifyKind = Literal["sequence", "scores", "token"]


class ClassifyResult(msgspec.Struct, omit_defaults=True):
    """One input's result. sequence: label, probabilities; scores: scores and selected; token:
    spans. `score` (the label's probability or relevance) and `logits` are ours."""

    index: int
    label: str | None = None
    score: float | None = None
    probabilities: list[float] | None = None
    scores: list[float] | None = None
    logits: list[float] | None = None
    selected: list[str] | None = None
    spans: list[Span] | None = None
    tokens: list[TokenProbabilities] | None = None
    windows: list[ClassifyWindow] | None = None
    input: InputUsage | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class ClassifyResponse(msgspec.Struct, omit_defaults=True):
    model: str
    head: str
    kind: ClassifyKind
    labels: list[str]
    results: list[ClassifyResult]
    usage: Usage
    object: str = _always("classification")
    meta: ResponseMeta | None = None


class SparseEmbedding(msgspec.Struct):
    """A sparse embedding (`options.output: "sparse"`): vocabulary ids, ascending, and their
    weights; ids left out weigh 0 (TEI's /embed_sparse gives the same pairs)."""

    indices: list[int]
    values: list[float]


class Embedding(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One input's embedding; `object` is always "embedding" (OpenAI's, and required upstream).
    `embedding` is the dense vector (floats, or base64 of float32; integers, or base64 of their
    bytes, under `options.embedding_type`); with `options.output`
    `sparse` the input has `sparse_embedding` instead, with `multi_vector` or `tokens` its
    `token_embeddings` (one vector per token), so `embedding` keeps upstream's type."""

    index: int
    object: str
    embedding: list[float] | str | None = None
    sparse_embedding: SparseEmbedding | None = None
    token_embeddings: list[list[float]] | None = None
    input: InputUsage | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class EmbeddingsUsage(msgspec.Struct):
    """OpenAI's embeddings usage (upstream keeps it on this surface)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(msgspec.Struct, omit_defaults=True, kw_only=True):
    """`object` is always "list" (OpenAI's, and required upstream)."""

    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
    object: str
    meta: ResponseMeta | None = None


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float | None = None
    logit: float | None = None
    document: str | None = None
    input: InputUsage | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class RerankResponse(msgspec.Struct, omit_defaults=True):
    model: str
    results: list[RerankResult]
    usage: Usage
    object: str = _always("rerank")
    meta: ResponseMeta | None = None


def texts_of(value: ClassifyInput) -> list[tuple[str, str | None]]:
    """Classify input in its one general form: (text, optional pair) per input. A grounded item
    is an UnsupportedOption (no model here has a grounded head), an object without `text` an
    InvalidRequest, each naming its field."""
    values = value if isinstance(value, list) else [value]
    out: list[tuple[str, str | None]] = []
    for index, item in enumerate(values):
        if isinstance(item, str):
            out.append((item, None))
            continue
        where = "input" if not isinstance(value, list) else f"input[{index}]"
        for name in ("context", "question", "answer"):
            if getattr(item, name) is not None:
                raise UnsupportedOption(  # a head the models here lack: their refusal, 422
                    f"{where}.{name}: grounded {{context, question, answer}} items need a grounded head, "
                    "which this server does not run; give {text} or {text, text_pair}",
                    param=f"{where}.{name}",
                )
        if item.text is None:
            raise InvalidRequest(f"{where}.text: required", param=f"{where}.text")
        out.append((item.text, item.text_pair))
    return out

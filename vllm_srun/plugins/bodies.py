"""Pieces every surface's bodies share: the request `options`, the error code of one item,
`usage` and `meta`, named as the upstream runtime's contract (2.3.0) names them.

They sit apart from the surfaces' own bodies so that each surface module (`surfaces`,
`decision_surface`) can import them, and `surfaces` can import every surface's request
type to describe it, without an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, cast, get_args

import msgspec

from vllm_srun.errors import UnsupportedSurface
from vllm_srun.plugins.embedding_types import EmbeddingType

Overflow = Literal["reject", "truncate", "window"]
TruncationDirection = Literal["right", "left"]
OutputKind = Literal["dense", "sparse", "multi_vector", "tokens"]


class WindowOptions(msgspec.Struct, forbid_unknown_fields=True):
    tokens: Annotated[int, msgspec.Meta(ge=2)]
    overlap: Annotated[int, msgspec.Meta(ge=0)] = 0


class Options(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The options of every surface, in one struct: what families read. Each surface decodes
    and documents only the options it reads, as a type of its own made from this one by
    `options_type` (upstream's ClassifyOptions, EmbeddingsOptions, RerankOptions), so a
    generated client never sends an option the surface refuses.

    `overflow` left out (None) means the server's default for a long input: truncation under
    `serve --auto-truncate`, else `reject` (a 400 on OpenAI-shaped embeddings, the item's own
    error elsewhere). `truncation_direction` says which end `truncate` cuts: "left" keeps a
    text's last tokens (TEI's `truncation_direction: Left`). `normalize` (embeddings) left out
    follows the package; `false` answers the vector before a trailing Normalize module (TEI's
    `normalize: false`), `true` a unit vector whatever the package says. `return_logits`
    (classify) adds each sequence result's raw logits, which probabilities fix only up to a
    constant (TEI's `raw_scores`). `max_tokens` is a per-input token budget, special tokens
    included (default and ceiling: the model's limit); an input over it meets `overflow`.
    `profile` names the numerics a request expects: the model's own (`exact` for float32), else
    a 422 naming `options.profile` (which profiles a model serves is the model's, not the
    document's, to say). `output` (embeddings, rerank) is the kind of embedding: `dense` (one
    pooled vector; the default where the model has one), `sparse` (SPLADE or bge-m3 lexical
    weights, `{indices, values}`), `multi_vector` (ColBERT's per-token vectors where the
    package has a projection, else every token's state) or `tokens` (every token's last hidden
    state, TEI's /embed_all); rerank takes `dense` or `multi_vector` (MaxSim). `head` picks a model's head by name (on classify the
    request's top-level `head` is upstream's field for it, and this one its alias).
    `embedding_type` (embeddings, dense only) quantizes each vector as sentence-transformers'
    `quantize_embeddings` does (plugins/quantization.py): `int8` and `uint8` on the model's
    calibration ranges (/v1/models shows them), `binary` and `ubinary` as packed sign bits;
    with `encoding_format: base64` the value is base64 of its bytes.
    `late_chunking` (embeddings) is the request's top-level field of that name, as an option.
    """

    return_meta: bool = False
    overflow: Overflow | None = None
    truncation_direction: TruncationDirection = "right"
    window: WindowOptions | None = None
    threshold: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    return_tokens: bool = False
    head: str | None = None
    deadline_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None
    normalize: bool | None = None
    return_logits: bool = False
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    profile: Annotated[str, msgspec.Meta(pattern="^[a-z][a-z0-9_]*$")] | None = None
    output: OutputKind | None = None
    embedding_type: EmbeddingType | None = None
    late_chunking: bool | None = None

    @property
    def overflow_mode(self) -> Overflow:
        """The long-input policy in force: `reject` when the request names none."""
        return self.overflow or "reject"


_DEFAULTS = Options()


class _SurfaceOptions(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The base of every type `options_type` makes: an option of `Options` that the surface
    does not take reads as its default, so a family reads any option of any surface's options
    as it reads `Options`."""

    def __getattr__(self, name: str) -> Any:
        if name in Options.__struct_fields__:
            return getattr(_DEFAULTS, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    overflow_mode = Options.overflow_mode


def options_type(
    name: str, names: Iterable[str], doc: str, *, narrowed: Mapping[str, Any] | None = None
) -> type[Options]:
    """A Struct named `name` with the fields of `Options` in `names` (their types, bounds and
    defaults, in `Options`' order), refusing any other: one surface's options as it decodes and
    documents them. Typed as `Options`, which it reads as (see `_SurfaceOptions`). `narrowed`
    gives a field a narrower type where the surface takes fewer of its values (rerank's
    `output`), so the document lists only those."""
    wanted = frozenset(names)
    unknown = wanted - set(Options.__struct_fields__)
    if unknown:
        raise ValueError(f"{name}: not fields of Options: {sorted(unknown)}")
    types = {f.name: f.type for f in msgspec.structs.fields(Options)} | dict(narrowed or {})
    fields = [
        (f.name, types[f.name], msgspec.field(default=f.default))
        if f.default_factory is msgspec.NODEFAULT
        else (f.name, types[f.name], msgspec.field(default_factory=f.default_factory))
        for f in msgspec.structs.fields(Options)
        if f.name in wanted
    ]
    made = msgspec.defstruct(
        name,
        fields,
        bases=(_SurfaceOptions,),
        module=__name__,
        namespace={"__doc__": doc},
        forbid_unknown_fields=True,
        omit_defaults=True,
    )
    return cast("type[Options]", made)


class UnsupportedOption(UnsupportedSurface):
    """An option the document allows that the served model does not take (a profile it does
    not serve, a threshold its head does not read): the model's refusal, 422 like a surface it
    does not serve (TEI's 424 on TEI's routes)."""

    code = "unsupported_option"


# What an over-long input's message ends with on our routes; a peer's route says its own words
# in its place (TEI's `truncate: true`).
OVERFLOW_HINT = "(set options.overflow to 'truncate' or 'window')"
# The same on OpenAI-shaped embeddings, where an over-long input fails the whole request.
REFUSAL_HINT = (
    "(set options.overflow to 'truncate', or serve with --auto-truncate; "
    "options.overflow 'reject' answers each input in place)"
)


def policy_words(mode: str) -> str:
    """How a character bound names the policy it was read under ("under options.overflow
    'truncate'"); a peer's route names its own field in its place."""
    return f"under options.overflow '{mode}'"


# Why one item (an input, a document, a question) has no result: upstream's ItemError codes,
# the only codes an item's `error` carries on the wire, each with a `message` beside it.
ItemErrorCode = Literal[
    "invalid_question",
    "invalid_input",
    "max_length_exceeded",
    "scan_budget_exceeded",
    "invalid_model_output",
    "deadline_exceeded",
    "unavailable",
]
ITEM_ERROR_CODES: frozenset[str] = frozenset(get_args(ItemErrorCode))


def item_error_code(code: str) -> ItemErrorCode:
    """`code` as upstream's ItemError: itself when it is one. A plugin's own code outside the
    vocabulary is an input's fault when it says so (`invalid_request`), else the service's."""
    if code in ITEM_ERROR_CODES:
        return code  # type: ignore[return-value]
    return "invalid_input" if code == "invalid_request" else "unavailable"


class Usage(msgspec.Struct, omit_defaults=True):
    """Tokens a request read and wrote (upstream's Usage). Encoders write none, so
    `output_tokens` is 0; rerank also carries OpenAI's `prompt_tokens`/`total_tokens`."""

    input_tokens: int
    output_tokens: int
    prompt_tokens: int | None = None
    total_tokens: int | None = None


class Representation(msgspec.Struct, omit_defaults=True):
    """The identity of an embedding space: vectors whose representations differ never mix."""

    model_sha256: str
    layer: int
    dimension: int
    normalized: bool | None = None
    modality: str | None = None


class CacheMeta(msgspec.Struct):
    """How many of a request's work items the result cache answered (ours, not upstream's)."""

    hits: int
    misses: int


class ResponseMeta(msgspec.Struct, omit_defaults=True):
    """`meta` of a response (`options.return_meta`), in upstream's ResponseMeta names; `cache` is
    ours. The family fills what the model knows; the server adds where and how long it ran."""

    model_id: str | None = None
    revision: str | None = None  # the Hub revision; none for a local package directory
    model_sha256: str | None = None
    profile: str | None = None
    numerics: str | None = None
    engine: str | None = None
    # Ours: the forward paths the deployment's engines choose between (e.g. the packed native
    # forward and an onnxruntime one for small batches); `engine` stays the one named at start.
    engine_paths: list[str] | None = None
    accelerator: str | None = None
    device: str | None = None
    queue_ms: float | None = None
    compute_ms: float | None = None
    head: str | None = None
    representation: Representation | None = None
    cache: CacheMeta | None = None


def merged_meta(meta: Any, **fields: Any) -> Any:
    """`meta` with `fields` added where it has none: a ResponseMeta stays one (a family's plain
    dict stays a dict), so the server can add placement and timing to any surface's meta."""
    if isinstance(meta, ResponseMeta):
        own = {k: v for k, v in fields.items() if getattr(meta, k) is None}
        return msgspec.structs.replace(meta, **own)
    if meta is None:
        return ResponseMeta(**fields)
    return {**{k: v for k, v in fields.items() if v is not None}, **meta}


EXACT_PROFILE = "exact"
MAX_SPEED_PROFILE = "max_speed"
# What --dtype accepts (auto: float32), and what each computes in: `serve --help` and each
# model card's profile in /v1/models say it in these words.
DTYPES = ("auto", "float32", "bfloat16", "int8")
_CHECKED = f"approximate, checked against float32 at start (profile {MAX_SPEED_PROFILE})"
NUMERICS = {
    "float32": f"float32 weights and activations: exact, the reference (profile {EXACT_PROFILE})",
    "bfloat16": f"bfloat16 weights and activations: {_CHECKED}",
    "int8": f"int8 linear layers with per-token scales, the rest float32: {_CHECKED}",
}


def served_profile(numerics: str) -> str:
    """The profile a model is served under: `exact` for float32 numerics, else `max_speed`."""
    return EXACT_PROFILE if numerics == "float32" else MAX_SPEED_PROFILE


def check_profile(options: Options, numerics: str) -> None:
    """A request's `options.profile` must be the one the model is served under (else a 422)."""
    if options.profile is None:
        return
    served = served_profile(numerics)
    if options.profile != served:
        raise UnsupportedOption(
            f"options.profile: {options.profile!r} is not enabled for this model; it serves {served!r}",
            param="options.profile",
        )

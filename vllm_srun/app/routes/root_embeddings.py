"""POST /embeddings (and /infinity/embeddings): OpenAI's embeddings body at the root, where
text-embeddings-inference and Infinity both serve it, answered as /v1/embeddings answers.

The body is OpenAI's (`input`, `model`, `encoding_format`, `dimensions`, `user`) with what
Infinity's client adds: `modality: "text"` (the only one a text model has) and `dimensions:
0`, its way of asking for the model's own dimension. `model` is read as those servers read
it: TEI ignores it and Infinity's client sends `default/not-specified` by default, so a name
this server does not serve reaches the one model serving embeddings (with several, it is the
404 /v1/embeddings gives). An input that fails fails the request, as on /v1/embeddings.
Errors are OpenAI's, not TEI's OpenAI-route `{message, code, type}`: the openai client reads
OpenAI's as a BadRequestError with its `param`, TEI's as a bare APIStatusError without one.

POST /vllm/embeddings and /vllm/v1/embeddings take vLLM's body: OpenAI's (so the /vllm base URL
serves LiteLLM's `hosted_vllm/` embeddings as well as its rerank) with vLLM's own fields,
`truncate_prompt_tokens` (-1: the model's limit), `normalize`, `add_special_tokens` (only its
default here), `priority` and `request_id` (no effect), and everything /v1/embeddings takes.
Over-long inputs are refused in vLLM's words, as on vLLM's other routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.app.routes.embeddings import no_null_vectors
from vllm_srun.app.routes.vllm_rerank import PromptTokens, respond_in_vllm_words, truncation
from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import InvalidRequest, SrunError
from vllm_srun.plugins.bodies import REFUSAL_HINT, UnsupportedOption
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse, Options, TokenIds

# OpenAI's input forms, one per request: a text, texts, token ids, or lists of them. msgspec
# takes one array type per union, so the field is decoded late (`decode_input`) and documented
# as the four forms: the document refuses what the surface refuses (a list mixing them).
INPUT_FORMS = msgspec.Meta(
    extra_json_schema={
        "anyOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "items": {"type": "integer"}},
            {
                "type": "array",
                "minItems": 1,
                "items": {"type": "array", "minItems": 1, "items": {"type": "integer"}},
            },
        ]
    }
)
Input = Annotated[Any, INPUT_FORMS]
_InputType = str | Annotated[list[str | int | TokenIds], msgspec.Meta(min_length=1)]


def decode_input(value: Any) -> Any:
    """`input` as the surface takes it; an InvalidRequest naming `input` for any other value
    (the surface itself refuses a list mixing the forms)."""
    try:
        return msgspec.convert(value, type=_InputType, strict=True)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        raise InvalidRequest(f"input{where.rstrip('`')}: {message}", param="input") from None


class RootEmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI's embeddings body as TEI and Infinity take it."""

    input: Input
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=0)] | None = None
    user: str | None = None
    modality: Literal["text"] = "text"


def served_model(runtime: Runtime, name: str | None, surface: str) -> str | None:
    """`name` if this server serves it; else the only model serving `surface`, when there is
    one (TEI's and Infinity's reading of a name they do not check); else `name`, for the
    surface's own 404."""
    if name is None or runtime.serving.find(name) is not None:
        return name
    serving = [
        n for n, s in runtime.models.items() if s.model is not None and surface in s.model.info.surfaces
    ]
    return serving[0] if len(serving) == 1 else name


def convert(runtime: Runtime, data: RootEmbeddingsRequest, options: Options) -> EmbeddingsRequest:
    return EmbeddingsRequest(
        input=decode_input(data.input),
        model=served_model(runtime, data.model, EMBEDDINGS.name),
        encoding_format=data.encoding_format,
        dimensions=data.dimensions or None,
        user=data.user,
        options=options,
    )


# This body has no `options`: the way out of an over-long input here is the server's flag, as
# TEI's OpenAI route reads only its --auto-truncate, or /v1/embeddings' option.
ROOT_HINT = "(serve with --auto-truncate, or set options.overflow to 'truncate' on /v1/embeddings)"


async def _serve(
    request: Request[Any, Any, Any], state: State, data: RootEmbeddingsRequest, options: Options
) -> Response[Any]:
    converted = convert(state.runtime, data, options)
    try:
        return await respond(request, state, EMBEDDINGS, converted, shape=no_null_vectors)
    except SrunError as exc:
        exc.message = exc.message.replace(REFUSAL_HINT, ROOT_HINT)
        raise


@post("/embeddings", status_code=200, summary="Embed texts (OpenAI-compatible, as TEI and Infinity serve it)")
async def embeddings(
    request: Request[Any, Any, Any], data: JSONBody[RootEmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    # TEI's OpenAI route truncates as the server's --auto-truncate says (the surface's default).
    return await _serve(request, state, data, Options())


@post("/infinity/embeddings", status_code=200, summary="Embed texts (Infinity-compatible)")
async def infinity_embeddings(
    request: Request[Any, Any, Any], data: JSONBody[RootEmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    # Infinity truncates an input over the model's limit (its tokenizer's truncation).
    return await _serve(request, state, data, Options(overflow="truncate"))


class VllmEmbeddingsRequest(EmbeddingsRequest, forbid_unknown_fields=True):
    """vLLM's embeddings body: /v1/embeddings' with vLLM's fields added."""

    truncate_prompt_tokens: PromptTokens = None
    normalize: bool | None = None
    add_special_tokens: bool = True
    priority: int = 0
    request_id: str | None = None


def as_embeddings(runtime: Runtime, data: VllmEmbeddingsRequest) -> EmbeddingsRequest:
    """The /v1/embeddings request a vLLM body asks for. vLLM's field and the option it stands
    for are one setting: both given is an InvalidRequest naming the pair."""
    options = data.options
    if data.truncate_prompt_tokens is not None:
        if options.overflow is not None or options.max_tokens is not None:
            raise InvalidRequest(
                "truncate_prompt_tokens: give it or options.overflow/options.max_tokens, not both",
                param="truncate_prompt_tokens",
            )
        policy = truncation(data.truncate_prompt_tokens, runtime, data.model)
        options.overflow, options.max_tokens = policy.overflow, policy.max_tokens
    if data.normalize is not None:
        if options.normalize is not None and options.normalize != data.normalize:
            raise InvalidRequest("normalize: differs from options.normalize", param="normalize")
        options.normalize = data.normalize
    if not data.add_special_tokens:
        # A text's special tokens are the model's own template; ids are taken as given anyway.
        raise UnsupportedOption(
            "add_special_tokens: false is not supported (send token ids to choose every token)",
            param="add_special_tokens",
        )
    fields = {name: getattr(data, name) for name in EmbeddingsRequest.__struct_fields__}
    return EmbeddingsRequest(**fields)


async def _as_v1(request: Request[Any, Any, Any], state: State, data: VllmEmbeddingsRequest) -> Response[Any]:
    converted = as_embeddings(state.runtime, data)
    # As POST /v1/embeddings answers it: per-item errors only when asked for.
    shape = None if converted.options.overflow is not None else no_null_vectors
    return await respond_in_vllm_words(request, state, EMBEDDINGS, converted, shape)


@post("/vllm/embeddings", status_code=200, summary="Embed texts (vLLM-compatible)")
async def vllm_embeddings(
    request: Request[Any, Any, Any], data: JSONBody[VllmEmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    return await _as_v1(request, state, data)


@post("/vllm/v1/embeddings", status_code=200, summary="Embed texts (vLLM-compatible, /v1 path)")
async def vllm_v1_embeddings(
    request: Request[Any, Any, Any], data: JSONBody[VllmEmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    return await _as_v1(request, state, data)

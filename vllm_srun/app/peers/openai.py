"""OpenAI's embeddings body at the root, POST /embeddings, where text-embeddings-inference and
Infinity both serve it, answered as /v1/embeddings answers it (a failed input fails the request).

`model` is read as those servers read it: a name this server does not serve reaches the one
model serving embeddings. Infinity's client adds `modality: "text"` and `dimensions: 0` (the
model's own dimension). Errors are OpenAI's, so the openai client reads them with their `param`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.failures import no_null_vectors
from vllm_srun.app.responses import respond
from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import InvalidRequest, SrunError
from vllm_srun.plugins.bodies import REFUSAL_HINT
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


async def serve(
    request: Request[Any, Any, Any], state: State, data: RootEmbeddingsRequest, options: Options
) -> Response[Any]:
    """`data` served on the embeddings surface with `options`, a failed input failing the request."""
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
    return await serve(request, state, data, Options())

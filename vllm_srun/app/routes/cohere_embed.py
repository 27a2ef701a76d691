"""POST /v1/embed and /v2/embed: Cohere's embed, an adapter onto the embeddings surface.

The bodies are Cohere's, so `cohere.Client(base_url=...).embed(...)` (v1) and
`cohere.ClientV2(base_url=...).embed(...)` work unchanged, and so do the integrations built on
them (langchain-cohere's CohereEmbeddings). `texts`, `model`, `input_type`, `embedding_types`,
`truncate`, and on v2 `output_dimension` (the surface's `dimensions`), `max_tokens` (its
`options.max_tokens`) and `priority` (accepted, no effect). The vectors are /v1/embeddings'
for the same texts.

- `input_type` picks the package's prompt for the role: `search_query` its query prompt,
  `search_document` its document prompt (where the model has prompts for these roles, as
  `/v1/models` lists them in `input_types`), `classification` and `clustering` a prompt of that
  name if the package has one. Without one the text is embedded as it is: Cohere's input types
  are hints its own models read, and a model here without prompts reads none.
- `truncate` is Cohere's: `END` (the default, also for null) keeps a text's first tokens,
  `START` its last, `NONE` refuses a text over the model's limit (a 400 naming `texts[i]`).
- A refusal names the body's fields (`texts[i]`, `max_tokens`, `output_dimension`), never the
  embeddings surface's (`input[i]`, `options.max_tokens`, `dimensions`).
- `embedding_types` takes Cohere's `float`, `int8`, `uint8`, `binary`, `ubinary` and `base64`
  (base64 of the float32 little-endian bytes), several at once. The integer types are
  sentence-transformers' `quantize_embeddings` of the float vector (plugins/quantization.py),
  int8 and uint8 on the model's calibration ranges (app/quantization.py, shown on /v1/models):
  Cohere's own quantisation is its models', which it does not specify. Each is made from the
  model's dense vector: a model without one (SPLADE, PyLate ColBERT) refuses the request, a
  422 naming `model`.
- v1 answers `embeddings_floats` (a list of vectors) unless `embedding_types` is given, then
  `embeddings_by_type` (`{"float": [...], "int8": [...]}`, the types asked for), which v2
  always answers (`float` when `embedding_types` is left out).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app import embedding_types as quantization
from vllm_srun.app.errors import item_failure
from vllm_srun.app.models import input_types
from vllm_srun.app.responses import respond
from vllm_srun.app.routes.cohere_rerank import CohereApiVersion
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import calibration_runner
from vllm_srun.errors import SrunError
from vllm_srun.plugins.bodies import OVERFLOW_HINT, REFUSAL_HINT, Options, policy_words
from vllm_srun.plugins.embedding_types import as_base64, as_json
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse

CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
InputType = Literal["search_document", "search_query", "classification", "clustering"]
Truncate = Literal["NONE", "START", "END"]
Texts = Annotated[list[str], msgspec.Meta(min_length=1)]
# The role each search input type stands for; the other types name a prompt of their own name.
ROLES = {"search_query": "query", "search_document": "document"}
# What an over-long text's message says to do, in Cohere's field.
COHERE_HINT = "(send truncate: END or START)"


def in_cohere_words(message: str) -> str:
    """`message` with the surface's way out of an over-long input said in Cohere's field."""
    return (
        message.replace(OVERFLOW_HINT, COHERE_HINT)
        .replace(REFUSAL_HINT, COHERE_HINT)
        .replace(policy_words("truncate"), "under truncate END or START")
    )


# The surface's fields that Cohere's body spells its own way; `input[i]` is `texts[i]`. Cohere's
# body has no options: a refused `options.output` (no dense vector) is the model's doing.
COHERE_FIELDS = {
    "options.max_tokens": "max_tokens",
    "dimensions": "output_dimension",
    "options.output": "model",
}


def in_cohere_fields(exc: SrunError) -> SrunError:
    """`exc` naming the Cohere body's field where it names the surface's (its `param`, and the
    message that starts with it)."""
    name = exc.param
    if name is None:
        return exc
    renamed = COHERE_FIELDS.get(name)
    if renamed is None and (name == "input" or name.startswith("input[")):
        renamed = "texts" + name[len("input") :]
    if renamed is not None:
        if exc.message.startswith(name):
            exc.message = renamed + exc.message[len(name) :]
        exc.param = renamed
    return exc


class CohereEmbedRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Cohere v1's embed body (`model` may be left out when one model is served)."""

    texts: Texts
    model: str | None = None
    input_type: InputType | None = None
    embedding_types: Annotated[list[CohereEmbeddingType], msgspec.Meta(min_length=1)] | None = None
    truncate: Truncate | None = None  # null as absent: END (langchain-cohere sends null)


class CohereEmbedV2Request(CohereEmbedRequest, forbid_unknown_fields=True):
    """Cohere v2's embed body: v1's with `output_dimension` and `max_tokens`."""

    output_dimension: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    priority: int | None = None  # accepted; no effect here


class CohereEmbeddingsByType(msgspec.Struct, omit_defaults=True):
    """Cohere's embeddings by type: the types the request named, each a list over the texts."""

    floats: list[list[float]] | None = msgspec.field(default=None, name="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereEmbedBilledUnits(msgspec.Struct):
    input_tokens: int


class CohereEmbedMeta(msgspec.Struct):
    api_version: CohereApiVersion
    billed_units: CohereEmbedBilledUnits


class CohereEmbedFloatsResponse(msgspec.Struct, tag_field="response_type", tag="embeddings_floats"):
    id: str
    embeddings: list[list[float]]
    texts: list[str]
    meta: CohereEmbedMeta


class CohereEmbedByTypeResponse(msgspec.Struct, tag_field="response_type", tag="embeddings_by_type"):
    id: str
    embeddings: CohereEmbeddingsByType
    texts: list[str]
    meta: CohereEmbedMeta


def prompt_fields(runtime: Runtime, data: CohereEmbedRequest) -> dict[str, Any]:
    """The surface's prompt field for `input_type`, where the model has that prompt; else none."""
    if data.input_type is None:
        return {}
    _, model = runtime.model_for(data.model)
    role = ROLES.get(data.input_type)
    if role is not None:
        return {"input_type": role} if role in input_types(model) else {}
    return {"prompt_name": data.input_type} if data.input_type in model.prompts() else {}


def convert(runtime: Runtime, data: CohereEmbedRequest) -> EmbeddingsRequest:
    v2 = data if isinstance(data, CohereEmbedV2Request) else None
    options = Options(
        output="dense",  # one vector per text: a model without one (SPLADE, PyLate) refuses it
        overflow="reject" if data.truncate == "NONE" else "truncate",
        truncation_direction="left" if data.truncate == "START" else "right",
        max_tokens=v2.max_tokens if v2 else None,
    )
    texts: list[Any] = list(data.texts)
    return EmbeddingsRequest(
        input=texts,
        model=data.model,
        dimensions=v2.output_dimension if v2 else None,
        options=options,
        **prompt_fields(runtime, data),
    )


def vectors(body: EmbeddingsResponse) -> list[list[float]]:
    """Each text's vector, in order; a text that failed fails the request, naming `texts[i]`."""
    out = []
    for item in sorted(body.data, key=lambda item: item.index):
        if item.error is not None:
            message = in_cohere_words(item.message) if item.message else None
            raise item_failure("texts", item.index, item.error, message)
        assert isinstance(item.embedding, list)
        out.append(item.embedding)
    return out


async def by_type(
    runtime: Runtime, data: CohereEmbedRequest, request: EmbeddingsRequest, found: list[list[float]]
) -> CohereEmbeddingsByType:
    """The vectors in each type `data` names (float when it names none)."""
    kinds = list(dict.fromkeys(data.embedding_types or ["float"]))
    floats = np.asarray(found, dtype=np.float32).reshape(len(found), -1)
    served, model = runtime.model_for(data.model)
    quantized = [kind for kind in kinds if kind not in ("float", "base64")]
    typed = await quantization.typed(
        served.calibration, model, request, floats, quantized, calibration_runner(runtime)
    )
    return CohereEmbeddingsByType(
        floats=found if "float" in kinds else None,
        base64=[as_base64(row) for row in floats] if "base64" in kinds else None,
        **{kind: as_json(values) for kind, values in typed.items()},
    )


def answer(runtime: Runtime, data: CohereEmbedRequest, request: EmbeddingsRequest, version: str) -> Any:
    by_types = version == "2" or data.embedding_types is not None

    async def shape(body: EmbeddingsResponse) -> CohereEmbedFloatsResponse | CohereEmbedByTypeResponse:
        found = vectors(body)
        meta = CohereEmbedMeta(CohereApiVersion(version), CohereEmbedBilledUnits(body.usage.prompt_tokens))
        if by_types:
            embeddings = await by_type(runtime, data, request, found)
            return CohereEmbedByTypeResponse(str(uuid.uuid4()), embeddings, data.texts, meta)
        return CohereEmbedFloatsResponse(str(uuid.uuid4()), found, data.texts, meta)

    return shape


async def _serve(
    request: Request[Any, Any, Any], state: State, data: CohereEmbedRequest, version: str
) -> Response[Any]:
    try:
        embeddings = convert(state.runtime, data)
        shape = answer(state.runtime, data, embeddings, version)
        return await respond(request, state, EMBEDDINGS, embeddings, shape=shape)
    except SrunError as exc:  # a request-level refusal (a character bound) in Cohere's words too
        exc.message = in_cohere_words(exc.message)
        raise in_cohere_fields(exc) from None


@post("/v1/embed", status_code=200, summary="Embed texts (Cohere v1-compatible)")
async def cohere_embed_v1(
    request: Request[Any, Any, Any], data: JSONBody[CohereEmbedRequest], state: State
) -> Response[CohereEmbedFloatsResponse | CohereEmbedByTypeResponse]:
    return await _serve(request, state, data, "1")


@post("/v2/embed", status_code=200, summary="Embed texts (Cohere v2-compatible)")
async def cohere_embed_v2(
    request: Request[Any, Any, Any], data: JSONBody[CohereEmbedV2Request], state: State
) -> Response[CohereEmbedByTypeResponse]:
    return await _serve(request, state, data, "2")

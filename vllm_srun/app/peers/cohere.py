"""Cohere's rerank (POST /v2/rerank) and embed (POST /v1/embed, /v2/embed), adapters onto the
rerank and embeddings surfaces, so `cohere.Client` / `cohere.ClientV2(base_url=...)` and the
integrations built on them work unchanged. Cohere truncates rather than refuses: rerank always
truncates to the model's limit; embed's `truncate` is `END` (default), `START` or `NONE`. A
refusal names the body's fields (`texts[i]`, `output_dimension`), never the surface's.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.failures import item_failure
from vllm_srun.app.responses import respond
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.service.model_cards import input_types
from vllm_srun.app.serving import typed_vectors
from vllm_srun.errors import SrunError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import OVERFLOW_HINT, REFUSAL_HINT, Options, UnsupportedOption, policy_words
from vllm_srun.plugins.embedding_types import as_base64, as_json
from vllm_srun.plugins.surfaces import (
    EMBEDDINGS,
    RERANK,
    EmbeddingsRequest,
    EmbeddingsResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
)

# The api_version Cohere's v2 endpoints report in `meta`.
API_VERSION = "2"


class CohereDocument(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    text: str
    title: str | None = None


class CohereRelevantSpans(msgspec.Struct):
    """Cohere's relevant-span option: spans come from Cohere's own models, so only `disabled`
    (the document says so: `enabled` is refused as any value outside the schema is)."""

    mode: Literal["disabled"]
    threshold: float | None = None
    max_spans: int | None = None


class CohereRerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Cohere v2's rerank body (`model` may be left out when one model is served)."""

    query: str
    documents: Annotated[list[str | CohereDocument], msgspec.Meta(min_length=1)]
    model: str | None = None
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_tokens_per_doc: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool = False
    relevant_spans: CohereRelevantSpans | None = None
    priority: int | None = None


class CohereResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: CohereDocument | None = None


class CohereApiVersion(msgspec.Struct):
    version: str


class CohereBilledUnits(msgspec.Struct):
    search_units: int


class CohereTokens(msgspec.Struct):
    input_tokens: int


class CohereMeta(msgspec.Struct):
    api_version: CohereApiVersion
    billed_units: CohereBilledUnits
    tokens: CohereTokens


class CohereRerankResponse(msgspec.Struct):
    id: str
    results: list[CohereResult]
    meta: CohereMeta


def joined(document: str | CohereDocument) -> str:
    """The text a document is ranked as (see the module docstring)."""
    if isinstance(document, str):
        return document
    if document.title is None:
        return document.text
    return f"title: {document.title}\ntext: {document.text}"


def cut(model: LoadedModel, texts: list[str], max_tokens: int) -> list[str]:
    """Each text up to the end of its `max_tokens`-th token by the model's own tokenizer."""
    tokenizer = model.tokenizer()
    if tokenizer is None:
        raise UnsupportedOption(  # the model's refusal (it has no tokenizer): 422
            f"max_tokens_per_doc: model {model.info.name!r} has no tokenizer to count tokens with",
            param="max_tokens_per_doc",
        )
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return [
        text if len(enc.ids) <= max_tokens else text[: enc.offsets[max_tokens - 1][1]]
        for text, enc in zip(texts, encodings, strict=True)
    ]


def rerank_request(runtime: Runtime, data: CohereRerankRequest) -> RerankRequest:
    texts = [joined(d) for d in data.documents]
    if data.max_tokens_per_doc is not None:
        _, model = runtime.model_for(data.model)
        texts = cut(model, texts, data.max_tokens_per_doc)
    documents: list[str | RerankDocument] = list(texts)
    return RerankRequest(
        query=data.query,
        documents=documents,
        model=data.model,
        top_n=data.top_n,
        options=Options(overflow="truncate"),
    )


def rerank_answer(data: CohereRerankRequest) -> Any:
    def shape(body: RerankResponse) -> CohereRerankResponse:
        results = []
        for result in body.results:
            if result.error is not None:
                raise item_failure("documents", result.index, result.error, result.message)
            assert result.relevance_score is not None
            document = data.documents[result.index] if data.return_documents else None
            if isinstance(document, str):
                document = CohereDocument(text=document)
            results.append(CohereResult(result.index, result.relevance_score, document))
        meta = CohereMeta(
            api_version=CohereApiVersion(API_VERSION),
            billed_units=CohereBilledUnits(search_units=1),
            tokens=CohereTokens(input_tokens=body.usage.input_tokens),
        )
        return CohereRerankResponse(id=str(uuid.uuid4()), results=results, meta=meta)

    return shape


@post("/v2/rerank", status_code=200, summary="Rank documents by relevance (Cohere v2-compatible)")
async def cohere_rerank(
    request: Request[Any, Any, Any], data: JSONBody[CohereRerankRequest], state: State
) -> Response[CohereRerankResponse]:
    if data.max_tokens_per_doc is None:
        converted = rerank_request(state.runtime, data)
    else:  # tokenizing every document is planning-sized work: off the event loop
        converted = await asyncio.to_thread(rerank_request, state.runtime, data)
    return await respond(request, state, RERANK, converted, shape=rerank_answer(data))


# -- embed --------------------------------------------------------------------------------------

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


def embed_request(runtime: Runtime, data: CohereEmbedRequest) -> EmbeddingsRequest:
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
            raise item_failure("texts", item.index, item.error, item.message, words=in_cohere_words)
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
    typed = await typed_vectors(runtime, served, model, request, floats, quantized)
    return CohereEmbeddingsByType(
        floats=found if "float" in kinds else None,
        base64=[as_base64(row) for row in floats] if "base64" in kinds else None,
        **{kind: as_json(values) for kind, values in typed.items()},
    )


def embed_answer(runtime: Runtime, data: CohereEmbedRequest, request: EmbeddingsRequest, version: str) -> Any:
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
        embeddings = embed_request(state.runtime, data)
        shape = embed_answer(state.runtime, data, embeddings, version)
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

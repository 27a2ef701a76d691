"""POST /v2/rerank: Cohere's v2 rerank, an adapter onto the rerank surface.

The body is Cohere v2's, so `cohere.ClientV2(base_url=...).rerank(...)` works unchanged:
`model`, `query`, `documents` (strings, or objects with `text` and an optional `title`),
`top_n`, `max_tokens_per_doc`, and `return_documents` (which older clients send). `priority`
is accepted and has no effect here; `relevant_spans` may only be disabled. The answer is
Cohere's: `{id, results: [{index, relevance_score, document?}], meta: {api_version,
billed_units, tokens}}`, results by descending relevance.

- A titled document is ranked as the YAML text Cohere recommends for structured documents,
  `title: <title>\\ntext: <text>`: the same string always, so it is cached like any other, and
  a client sending that string itself gets the same score.
- Cohere truncates long documents rather than refusing them, so this route always truncates
  to the model's limit. `max_tokens_per_doc: N` first cuts each document after its N-th token
  (the model's own tokenizer, without special tokens), at that token's end in the text; the
  cut text is what is ranked, so its score is that text's score on /v1/rerank.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.errors import item_failure
from vllm_srun.app.responses import respond
from vllm_srun.app.runtime import Runtime
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import RERANK, Options, RerankDocument, RerankRequest, RerankResponse

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


def convert(runtime: Runtime, data: CohereRerankRequest) -> RerankRequest:
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


def answer(data: CohereRerankRequest) -> Any:
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
        converted = convert(state.runtime, data)
    else:  # tokenizing every document is planning-sized work: off the event loop
        converted = await asyncio.to_thread(convert, state.runtime, data)
    return await respond(request, state, RERANK, converted, shape=answer(data))

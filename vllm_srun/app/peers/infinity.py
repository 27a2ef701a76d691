"""Infinity's routes under /infinity, so `infinity_client.Client(base_url=".../infinity")` and
LiteLLM's `infinity/` provider work with that base URL alone: embeddings (OpenAI's body), rerank
and classify as adapters onto their surfaces, its model list and health. An input over the
model's limit is truncated, as Infinity's tokenizers truncate; `model: "default/not-specified"`
(the client's default) and any name not served reach the one model serving the surface.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers import openai
from vllm_srun.app.peers.failures import item_failure
from vllm_srun.app.peers.openai import RootEmbeddingsRequest, served_model
from vllm_srun.app.responses import respond
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.service.health import model_states, overall
from vllm_srun.errors import NotReady, UnsupportedSurface
from vllm_srun.plugins.surfaces import (
    CLASSIFY,
    RERANK,
    ClassifyRequest,
    ClassifyResponse,
    ClassifyResult,
    EmbeddingsResponse,
    Options,
    RerankRequest,
    RerankResponse,
)

DEFAULT_MODEL = "default/not-specified"


class InfinityUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class InfinityRerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    documents: Annotated[list[str], msgspec.Meta(min_length=1)]
    model: str = DEFAULT_MODEL
    top_n: Annotated[int, msgspec.Meta(gt=0)] | None = None
    return_documents: bool = False
    raw_scores: bool = False


class InfinityRank(msgspec.Struct):
    relevance_score: float
    index: int
    document: str | None


class InfinityRerankResponse(msgspec.Struct):
    object: str
    results: list[InfinityRank]
    model: str
    usage: InfinityUsage
    id: str
    created: int


class InfinityClassifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    input: Annotated[list[str], msgspec.Meta(min_length=1)]
    model: str = DEFAULT_MODEL
    raw_scores: bool = False


class InfinityLabel(msgspec.Struct):
    score: float
    label: str


class InfinityClassifyResponse(msgspec.Struct):
    object: str
    data: list[list[InfinityLabel]]
    model: str
    usage: InfinityUsage
    id: str
    created: int


def _model(runtime: Runtime, name: str, surface: str) -> str | None:
    return served_model(runtime, None if name == DEFAULT_MODEL else name, surface)


def _rerank_shape(data: InfinityRerankRequest) -> Any:
    def shape(body: RerankResponse) -> InfinityRerankResponse:
        results = []
        for result in body.results:
            if result.error is not None:
                raise item_failure("documents", result.index, result.error, result.message)
            score = result.logit if data.raw_scores and result.logit is not None else result.relevance_score
            assert score is not None
            document = data.documents[result.index] if data.return_documents else None
            results.append(InfinityRank(relevance_score=score, index=result.index, document=document))
        tokens = body.usage.input_tokens
        return InfinityRerankResponse(
            object="rerank",
            results=results,
            model=body.model,
            usage=InfinityUsage(tokens, tokens),
            id=f"infinity-{uuid.uuid4()}",
            created=int(time.time()),
        )

    return shape


@post("/infinity/embeddings", status_code=200, summary="Embed texts (Infinity-compatible)")
async def infinity_embeddings(
    request: Request[Any, Any, Any], data: JSONBody[RootEmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    # Infinity truncates an input over the model's limit (its tokenizer's truncation).
    return await openai.serve(request, state, data, Options(overflow="truncate"))


@post("/infinity/rerank", status_code=200, summary="Rerank documents (Infinity-compatible)")
async def infinity_rerank(
    request: Request[Any, Any, Any], data: JSONBody[InfinityRerankRequest], state: State
) -> Response[InfinityRerankResponse]:
    documents: list[Any] = list(data.documents)
    converted = RerankRequest(
        query=data.query,
        documents=documents,
        model=_model(state.runtime, data.model, RERANK.name),
        top_n=data.top_n,
        options=Options(overflow="truncate"),
    )
    return await respond(request, state, RERANK, converted, shape=_rerank_shape(data))


def labels_of(body: ClassifyResponse, result: ClassifyResult, raw: bool) -> list[InfinityLabel]:
    """One input's labels and scores, best first."""
    if result.error is not None:
        raise item_failure("input", result.index, result.error, result.message)
    per_label = result.probabilities if result.probabilities is not None else result.scores
    if per_label is not None:
        scores = result.logits if raw else per_label
        if scores is None:
            raise UnsupportedSurface(f"raw_scores: head {body.head!r} answers no logits")
        pairs = list(zip(body.labels, scores, strict=True))
    elif result.label is not None and result.score is not None:
        # A one-label head (a cross-encoder): its sigmoid, or its logit.
        pairs = [(result.label, result.logits[0] if raw and result.logits else result.score)]
    else:
        raise UnsupportedSurface(f"head {body.head!r} does not classify whole sequences")
    return [InfinityLabel(score=s, label=label) for label, s in sorted(pairs, key=lambda p: -p[1])]


@post("/infinity/classify", status_code=200, summary="Classify texts (Infinity-compatible)")
async def infinity_classify(
    request: Request[Any, Any, Any], data: JSONBody[InfinityClassifyRequest], state: State
) -> Response[InfinityClassifyResponse]:
    inputs: list[Any] = list(data.input)
    converted = ClassifyRequest(
        input=inputs,
        model=_model(state.runtime, data.model, CLASSIFY.name),
        options=Options(overflow="truncate", return_logits=data.raw_scores),
    )

    def shape(body: ClassifyResponse) -> InfinityClassifyResponse:
        tokens = body.usage.input_tokens
        return InfinityClassifyResponse(
            object="classify",
            data=[labels_of(body, result, data.raw_scores) for result in body.results],
            model=body.model,
            usage=InfinityUsage(tokens, tokens),
            id=f"infinity-{uuid.uuid4()}",
            created=int(time.time()),
        )

    return await respond(request, state, CLASSIFY, converted, shape=shape)


class InfinityModel(msgspec.Struct):
    id: str
    object: str
    created: int
    stats: dict[str, Any]
    backend: str
    capabilities: list[str]


class InfinityModels(msgspec.Struct):
    object: str
    data: list[InfinityModel]


# Infinity's capability names of the surfaces.
_CAPABILITIES = {"embeddings": "embed", "rerank": "rerank", "classify": "classify"}


@get("/infinity/models", summary="Served models (Infinity-compatible)")
async def infinity_models(state: State) -> InfinityModels:
    runtime: Runtime = state.runtime
    data = []
    for name, served in runtime.models.items():
        surfaces = served.model.info.surfaces if served.model is not None else []
        placement = served.placement
        data.append(
            InfinityModel(
                id=name,
                object="model",
                created=served.created,
                stats={},
                backend=placement.engine if placement else "",
                capabilities=[_CAPABILITIES[s] for s in surfaces if s in _CAPABILITIES],
            )
        )
    return InfinityModels(object="list", data=data)


class InfinityHealth(msgspec.Struct):
    unix: float


@get("/infinity/health", summary="Readiness (Infinity-compatible)", opt={"public": True})
async def infinity_health(state: State) -> InfinityHealth:
    status, reason = overall(await model_states(state.runtime))
    if status != "ready":
        raise NotReady(f"not ready: {reason or status}")
    return InfinityHealth(unix=time.time())

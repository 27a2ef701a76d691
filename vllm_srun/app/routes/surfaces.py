"""Each surface's own route, the contract the router speaks: POST /v1/classify, /v1/embeddings,
/v1/rerank and /v1/decisions (also /v1/systemone, the upstream runtime's name for it), each
decoding its surface's request and answering its response.

/v1/embeddings is OpenAI's too: a failed input fails the request unless the request asked for
per-item errors (`options.overflow`), as OpenAI's clients read every `embedding` as a vector.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.failures import no_null_vectors
from vllm_srun.app.responses import respond
from vllm_srun.plugins.decision_bodies import DecisionRequest, DecisionResponse
from vllm_srun.plugins.surfaces import (
    CLASSIFY,
    DECISIONS,
    EMBEDDINGS,
    RERANK,
    ClassifyRequest,
    ClassifyResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    RerankRequest,
    RerankResponse,
)


@post("/v1/classify", status_code=200, summary="Classify texts or text pairs")
async def classify(
    request: Request[Any, Any, Any], data: JSONBody[ClassifyRequest], state: State
) -> Response[ClassifyResponse]:
    return await respond(request, state, CLASSIFY, data)


@post("/v1/embeddings", status_code=200, summary="Embed texts (OpenAI-compatible)")
async def embeddings(
    request: Request[Any, Any, Any], data: JSONBody[EmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    if data.options.overflow is not None:  # per-item errors asked for, or truncation: as is
        return await respond(request, state, EMBEDDINGS, data)
    return await respond(request, state, EMBEDDINGS, data, shape=no_null_vectors)


@post("/v1/rerank", status_code=200, summary="Rank documents by relevance to a query")
async def rerank(
    request: Request[Any, Any, Any], data: JSONBody[RerankRequest], state: State
) -> Response[RerankResponse]:
    return await respond(request, state, RERANK, data)


@post("/v1/decisions", status_code=200, summary="Answer typed questions about a state")
async def decisions(
    request: Request[Any, Any, Any], data: JSONBody[DecisionRequest], state: State
) -> Response[DecisionResponse]:
    return await respond(request, state, DECISIONS, data)


# "systemone" is the upstream runtime's name for its decisions endpoint: the same controller
# at that path, under its own summary and operationId.
systemone = post(
    "/v1/systemone",
    status_code=200,
    summary="Answer typed questions about a state (alias)",
    operation_id="V1SystemoneSystemone",
)(decisions.fn)

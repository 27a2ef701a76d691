"""vLLM's rerank, POST /vllm/rerank and /vllm/v1/rerank (and POST /rerank with `documents`: see
`peers.tei.rerank`): `{model, query, documents, top_n}` with the fields clients send
(`return_documents`, `truncate_prompt_tokens`, `use_activation`, `priority`), answered as vLLM
does: `{id, model, usage, results: [{index, document: {text}, relevance_score}]}` by
descending score, every result with its document as `{text}` (LiteLLM's `hosted_vllm` reads it).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.failures import item_failure
from vllm_srun.app.peers.vllm.truncation import PromptTokens, in_vllm_words, respond_in_vllm_words, truncation
from vllm_srun.app.runtime import Runtime
from vllm_srun.plugins.surfaces import RERANK, RerankRequest, RerankResponse


class VllmRerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's rerank body (`model` may be left out when one model is served)."""

    query: str
    documents: Annotated[list[str], msgspec.Meta(min_length=1)]
    model: str | None = None
    top_n: Annotated[int, msgspec.Meta(ge=0)] = 0
    return_documents: bool | None = None
    truncate_prompt_tokens: PromptTokens = None
    use_activation: bool | None = None
    priority: int = 0


class VllmDocument(msgspec.Struct):
    text: str


class VllmRerankResult(msgspec.Struct):
    index: int
    document: VllmDocument
    relevance_score: float


class VllmRerankUsage(msgspec.Struct):
    total_tokens: int


class VllmRerankResponse(msgspec.Struct):
    id: str
    model: str
    usage: VllmRerankUsage
    results: list[VllmRerankResult]


def convert(runtime: Runtime, data: VllmRerankRequest) -> RerankRequest:
    documents: list[Any] = list(data.documents)
    return RerankRequest(
        query=data.query,
        documents=documents,
        model=data.model,
        top_n=data.top_n or None,
        options=truncation(data.truncate_prompt_tokens, runtime, data.model),
    )


def answer(data: VllmRerankRequest) -> Any:
    raw = data.use_activation is False

    def shape(body: RerankResponse) -> VllmRerankResponse:
        results = []
        for result in body.results:
            if result.error is not None:
                raise item_failure(
                    "documents", result.index, result.error, result.message, words=in_vllm_words
                )
            score = result.logit if raw and result.logit is not None else result.relevance_score
            assert score is not None
            results.append(VllmRerankResult(result.index, VllmDocument(data.documents[result.index]), score))
        tokens = body.usage.total_tokens if body.usage.total_tokens is not None else body.usage.input_tokens
        return VllmRerankResponse(
            id=f"rerank-{uuid.uuid4().hex}", model=body.model, usage=VllmRerankUsage(tokens), results=results
        )

    return shape


async def serve(request: Request[Any, Any, Any], state: State, data: VllmRerankRequest) -> Response[Any]:
    """`data` served on the rerank surface, answered in vLLM's shape."""
    return await respond_in_vllm_words(request, state, RERANK, convert(state.runtime, data), answer(data))


async def _rerank(
    request: Request[Any, Any, Any], data: JSONBody[VllmRerankRequest], state: State
) -> Response[VllmRerankResponse]:
    return await serve(request, state, data)


# One controller at both of vLLM's paths; each keeps its own summary and operationId.
rerank = post(
    "/vllm/rerank",
    status_code=200,
    summary="Rerank documents (vLLM-compatible)",
    operation_id="VllmRerankRerank",
)(_rerank)
rerank_v1 = post(
    "/vllm/v1/rerank",
    status_code=200,
    summary="Rerank documents (vLLM-compatible, /v1 path)",
    operation_id="VllmV1RerankRerankV1",
)(_rerank)

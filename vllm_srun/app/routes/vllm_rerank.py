"""vLLM's pooling-server rerank, an adapter onto the rerank surface: POST /vllm/rerank and
POST /vllm/v1/rerank, and POST /rerank when its body has `documents` (TEI's has `texts`; see
tei_rerank).

The body is vLLM's `{model, query, documents, top_n}` (`top_n: 0`, its default, keeps every
document), with the fields clients send it: `return_documents` (LiteLLM's `hosted_vllm`),
`truncate_prompt_tokens` (-1: truncate to the model's limit), `use_activation` (false answers
a cross-encoder's logit), `priority` (no effect here). The answer is vLLM's: `{id, model,
usage: {total_tokens}, results: [{index, document: {text}, relevance_score}]}` by descending
score, every result with its document as vLLM always sends it. Infinity (and this server's
/v1/rerank) answer the document as a string instead, which LiteLLM's `hosted_vllm` reader
cannot read, hence a route of vLLM's own.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.errors import item_failure
from vllm_srun.app.responses import respond
from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import InvalidRequest, SrunError
from vllm_srun.plugins.bodies import OVERFLOW_HINT, REFUSAL_HINT, UnsupportedOption, policy_words
from vllm_srun.plugins.surfaces import RERANK, Options, RerankRequest, RerankResponse, Surface

# vLLM's truncate_prompt_tokens: -1 (the model's limit) or a positive count (0 keeps nothing).
# No one msgspec type says that, so it is decoded late (`truncation`) and documented in full.
PromptTokens = Annotated[
    Any,
    msgspec.Meta(
        extra_json_schema={
            "anyOf": [{"type": "integer", "enum": [-1]}, {"type": "integer", "minimum": 1}, {"type": "null"}]
        }
    ),
]


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


def truncation(value: Any, runtime: Runtime, model: str | None) -> Options:
    """vLLM's `truncate_prompt_tokens` as the surfaces' options: -1 truncates to the model's
    limit, N keeps an input's first N tokens (special tokens included), none refuses an input
    over the limit, as vLLM does. Any other value is an InvalidRequest naming the field; an N
    past the model's limit its refusal (422), as vLLM refuses one past `max_model_len`."""
    if value is None:
        return Options()
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's integer: 2.0 is one
    if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -1:
        raise InvalidRequest(
            "truncate_prompt_tokens: -1 (the model's limit) or a positive count of tokens",
            param="truncate_prompt_tokens",
        )
    if value > 0:
        _, loaded = runtime.model_for(model)
        limit = loaded.info.max_tokens
        if limit is not None and value > limit:
            raise UnsupportedOption(
                f"truncate_prompt_tokens: {value} exceeds the model's limit of {limit} tokens",
                param="truncate_prompt_tokens",
            )
    return Options(overflow="truncate", max_tokens=None if value < 0 else value)


# The surfaces' hints for an input over the limit name their options; vLLM's body has its own.
VLLM_HINT = "(set truncate_prompt_tokens to -1 to truncate it)"


def in_vllm_words(message: str) -> str:
    """`message` with the surfaces' way out of an over-long input said as vLLM's body says it."""
    return (
        message.replace(OVERFLOW_HINT, VLLM_HINT)
        .replace(REFUSAL_HINT, VLLM_HINT)
        .replace(policy_words("truncate"), "under truncate_prompt_tokens")
    )


def failure(field: str, index: int, code: str, message: str | None) -> SrunError:
    """One input's error as the request's (`item_failure`), in vLLM's words."""
    return item_failure(field, index, code, in_vllm_words(message) if message else message)


async def respond_in_vllm_words(
    request: Request[Any, Any, Any], state: State, surface: Surface[Any], data: Any, shape: Any
) -> Response[Any]:
    """`respond`, with a request-level refusal (a surface that fails a whole request on an
    over-long input, as OpenAI-shaped embeddings do) in vLLM's words too."""
    try:
        return await respond(request, state, surface, data, shape=shape)
    except SrunError as exc:
        exc.message = in_vllm_words(exc.message)
        raise


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
                raise failure("documents", result.index, result.error, result.message)
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


@post("/vllm/rerank", status_code=200, summary="Rerank documents (vLLM-compatible)")
async def rerank(
    request: Request[Any, Any, Any], data: JSONBody[VllmRerankRequest], state: State
) -> Response[VllmRerankResponse]:
    return await serve(request, state, data)


@post("/vllm/v1/rerank", status_code=200, summary="Rerank documents (vLLM-compatible, /v1 path)")
async def rerank_v1(
    request: Request[Any, Any, Any], data: JSONBody[VllmRerankRequest], state: State
) -> Response[VllmRerankResponse]:
    return await serve(request, state, data)

"""vLLM's pooling server's POST /classify and POST /pooling (also under /vllm): adapters onto
the classify and embeddings surfaces.

/classify takes vLLM's `{model, input}` (a text or a list of texts) and answers `{id, object:
"list", created, model, data: [{index, label, probs, num_classes}], usage}`: `probs` are the
head's probabilities in its label order (a one-label head's sigmoid), `label` the best one;
`use_activation: false` answers the logits instead. /pooling takes `{model, input}` (texts or
token ids, as /v1/embeddings reads them) and answers each input's pooled vector as `{index,
object: "pooling", data}`: the embedding /v1/embeddings gives (a model without one, SPLADE or
PyLate ColBERT, refuses it: a 422 naming `model`). `truncate_prompt_tokens` is
vLLM's (-1: the model's limit); `priority` and `user` have no effect here.

This server's own /v1/classify keeps its contract's body; vLLM's is here.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.routes.root_embeddings import Input, decode_input
from vllm_srun.app.routes.vllm_rerank import PromptTokens, failure, respond_in_vllm_words, truncation
from vllm_srun.app.routes.vllm_score import UsageInfo
from vllm_srun.errors import SrunError, UnsupportedSurface
from vllm_srun.plugins.surfaces import (
    CLASSIFY,
    EMBEDDINGS,
    ClassifyRequest,
    ClassifyResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    Usage,
)


class VllmClassifyRequest(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's classify body (`model` may be left out when one model is served)."""

    input: str | Annotated[list[str], msgspec.Meta(min_length=1)]
    model: str | None = None
    truncate_prompt_tokens: PromptTokens = None
    use_activation: bool | None = None
    user: str | None = None
    priority: int = 0


class VllmClassification(msgspec.Struct):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class VllmClassifyResponse(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    data: list[VllmClassification]
    usage: UsageInfo


def usage_info(usage: Usage) -> UsageInfo:
    tokens = usage.prompt_tokens if usage.prompt_tokens is not None else usage.input_tokens
    return UsageInfo(prompt_tokens=tokens, total_tokens=tokens)


def _classify_shape(raw: bool) -> Any:
    def shape(body: ClassifyResponse) -> VllmClassifyResponse:
        data = []
        for result in body.results:
            if result.error is not None:
                raise failure("input", result.index, result.error, result.message)
            per_label = result.probabilities if result.probabilities is not None else result.scores
            if per_label is None and result.score is not None:
                per_label = [result.score]  # a one-label head: its sigmoid
            values = result.logits if raw else per_label
            if values is None:
                raise UnsupportedSurface(f"head {body.head!r} does not classify whole sequences")
            data.append(VllmClassification(result.index, result.label, list(values), len(values)))
        return VllmClassifyResponse(
            id=f"classify-{uuid.uuid4().hex}",
            object="list",
            created=int(time.time()),
            model=body.model,
            data=data,
            usage=usage_info(body.usage),
        )

    return shape


async def _classify(
    request: Request[Any, Any, Any], state: State, data: VllmClassifyRequest
) -> Response[Any]:
    raw = data.use_activation is False
    options = truncation(data.truncate_prompt_tokens, state.runtime, data.model)
    options.return_logits = raw
    inputs: list[Any] = [data.input] if isinstance(data.input, str) else list(data.input)
    converted = ClassifyRequest(input=inputs, model=data.model, options=options)
    return await respond_in_vllm_words(request, state, CLASSIFY, converted, _classify_shape(raw))


@post("/classify", status_code=200, summary="Classify texts (vLLM-compatible)")
async def classify(
    request: Request[Any, Any, Any], data: JSONBody[VllmClassifyRequest], state: State
) -> Response[VllmClassifyResponse]:
    return await _classify(request, state, data)


@post("/vllm/classify", status_code=200, summary="Classify texts (vLLM-compatible)")
async def vllm_classify(
    request: Request[Any, Any, Any], data: JSONBody[VllmClassifyRequest], state: State
) -> Response[VllmClassifyResponse]:
    return await _classify(request, state, data)


class PoolingRequest(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's pooling body for an embedding model."""

    input: Input
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: PromptTokens = None
    user: str | None = None
    priority: int = 0


class Pooled(msgspec.Struct):
    index: int
    object: str
    data: list[float] | str


class PoolingResponse(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    data: list[Pooled]
    usage: UsageInfo


def _pooling_shape(body: EmbeddingsResponse) -> PoolingResponse:
    data = []
    for item in body.data:
        if item.error is not None:
            raise failure("input", item.index, item.error, item.message)
        assert isinstance(item.embedding, (list, str))
        data.append(Pooled(index=item.index, object="pooling", data=item.embedding))  # type: ignore[arg-type]
    tokens = body.usage.prompt_tokens
    return PoolingResponse(
        id=f"pool-{uuid.uuid4().hex}",
        object="list",
        created=int(time.time()),
        model=body.model,
        data=data,
        usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
    )


async def _pool(request: Request[Any, Any, Any], state: State, data: PoolingRequest) -> Response[Any]:
    options = truncation(data.truncate_prompt_tokens, state.runtime, data.model)
    options.normalize = data.normalize
    options.output = "dense"  # a pooled vector: a model without one (SPLADE, PyLate) refuses it
    converted = EmbeddingsRequest(
        input=decode_input(data.input),
        model=data.model,
        encoding_format=data.encoding_format,
        dimensions=data.dimensions,
        options=options,
    )
    try:
        return await respond_in_vllm_words(request, state, EMBEDDINGS, converted, _pooling_shape)
    except SrunError as exc:
        if exc.param == "options.output":  # vLLM's body has no options: the model is the cause
            exc.param, exc.message = "model", "model" + exc.message[len("options.output") :]
        raise


@post("/pooling", status_code=200, summary="Pooled vectors of texts (vLLM-compatible)")
async def pooling(
    request: Request[Any, Any, Any], data: JSONBody[PoolingRequest], state: State
) -> Response[PoolingResponse]:
    return await _pool(request, state, data)


@post("/vllm/pooling", status_code=200, summary="Pooled vectors of texts (vLLM-compatible)")
async def vllm_pooling(
    request: Request[Any, Any, Any], data: JSONBody[PoolingRequest], state: State
) -> Response[PoolingResponse]:
    return await _pool(request, state, data)

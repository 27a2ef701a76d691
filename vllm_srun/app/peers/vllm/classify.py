"""vLLM's POST /classify and POST /pooling (also under /vllm): adapters onto the classify and
embeddings surfaces. /classify answers `{id, object: "list", created, model, data: [{index,
label, probs, num_classes}], usage}` (`use_activation: false`: logits); /pooling answers each
input's pooled vector, the embedding /v1/embeddings gives, as `{index, object: "pooling",
data}` (a model without one refuses it: a 422 naming `model`).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.docs import operation_ids
from vllm_srun.app.peers.failures import item_failure
from vllm_srun.app.peers.openai import Input, decode_input
from vllm_srun.app.peers.vllm.score import UsageInfo
from vllm_srun.app.peers.vllm.truncation import PromptTokens, in_vllm_words, respond_in_vllm_words, truncation
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
                raise item_failure("input", result.index, result.error, result.message, words=in_vllm_words)
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


@post(
    ["/classify", "/vllm/classify"],
    status_code=200,
    summary="Classify texts (vLLM-compatible)",
    operation_id=operation_ids(
        {"/classify": "ClassifyClassify", "/vllm/classify": "VllmClassifyVllmClassify"}
    ),
)
async def classify(
    request: Request[Any, Any, Any], data: JSONBody[VllmClassifyRequest], state: State
) -> Response[VllmClassifyResponse]:
    raw = data.use_activation is False
    options = truncation(data.truncate_prompt_tokens, state.runtime, data.model)
    options.return_logits = raw
    inputs: list[Any] = [data.input] if isinstance(data.input, str) else list(data.input)
    converted = ClassifyRequest(input=inputs, model=data.model, options=options)
    return await respond_in_vllm_words(request, state, CLASSIFY, converted, _classify_shape(raw))


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
            raise item_failure("input", item.index, item.error, item.message, words=in_vllm_words)
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


@post(
    ["/pooling", "/vllm/pooling"],
    status_code=200,
    summary="Pooled vectors of texts (vLLM-compatible)",
    operation_id=operation_ids({"/pooling": "PoolingPooling", "/vllm/pooling": "VllmPoolingVllmPooling"}),
)
async def pooling(
    request: Request[Any, Any, Any], data: JSONBody[PoolingRequest], state: State
) -> Response[PoolingResponse]:
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

"""TEI's model route, POST / and POST /invocations (SageMaker's path): the body goes where TEI
routes it by the model's kind (an embedding model embeds, or scores `{inputs: {source_sentence,
sentences}}`; a reranker reranks a body with `query`; anything else predicts). A body with
`parameters` is the Inference API's text-classification task (`huggingface_hub.InferenceClient`).
GET /ping is TEI's SageMaker health route: an empty 200 once every model is ready, else 503;
GET /, the Inference API's, is this server's index with the same statuses (`service/index.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import MediaType, Request, Response, get, post, route
from litestar.datastructures import State
from litestar.enums import HttpMethod
from litestar.params import JSONBody

from vllm_srun.app.peers.tei import embed as tei_embed
from vllm_srun.app.peers.tei import predict as tei_predict
from vllm_srun.app.peers.tei import rerank as tei_rerank
from vllm_srun.app.peers.tei.errors import TEI_ERRORS, TeiError
from vllm_srun.app.peers.tei.info import kind_of
from vllm_srun.app.peers.tei.requests import model_for
from vllm_srun.app.responses import respond
from vllm_srun.app.service.health import model_states, overall
from vllm_srun.plugins.surfaces import CLASSIFY, EMBEDDINGS, RERANK, ClassifyResponse

T = TypeVar("T")


class TaskParameters(msgspec.Struct, forbid_unknown_fields=True):
    """The Inference API's text-classification parameters."""

    top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None


class TaskRequest(msgspec.Struct, forbid_unknown_fields=True):
    inputs: str
    parameters: TaskParameters = msgspec.field(default_factory=TaskParameters)


def _body(value: dict[str, Any], kind: type[T]) -> T:
    try:
        return msgspec.convert(value, type=kind, strict=False)
    except msgspec.ValidationError as exc:
        raise TeiError("validation", f"body: {exc}", status=422) from exc


async def _task_classification(
    request: Request[Any, Any, Any], state: State, body: dict[str, Any]
) -> Response[Any]:
    task = _body(body, TaskRequest)
    raw = task.parameters.function_to_apply == "none"
    data = tei_predict.PredictRequest(inputs=task.inputs, raw_scores=raw)
    top_k = task.parameters.top_k

    def shape(response: ClassifyResponse) -> list[list[tei_predict.Prediction]]:
        best = tei_predict.predictions(response, response.results[0], raw)
        return [best[:top_k] if top_k else best]

    return await respond(request, state, CLASSIFY, tei_predict.convert(request, data), shape=shape)


async def _dispatch(
    request: Request[Any, Any, Any], data: JSONBody[dict[str, Any]], state: State
) -> Response[Any]:
    _, model = model_for(state.runtime, None)
    kind = kind_of(model)
    if kind == "embedding" and isinstance(data.get("inputs"), dict):
        pair = _body(data, tei_embed.SimilarityRequest)
        converted_pair = tei_embed.similarity_request(request, pair)
        return await respond(request, state, EMBEDDINGS, converted_pair, shape=tei_embed.similarities)
    if kind == "embedding":
        embed = _body(data, tei_embed.EmbedRequest)
        converted = tei_embed.embed_request(request, embed)
        return await respond(request, state, EMBEDDINGS, converted, shape=tei_embed.vectors)
    if kind == "reranker" and "query" in data:
        ranked = _body(data, tei_rerank.TeiRerankRequest)
        return await respond(
            request, state, RERANK, tei_rerank.convert(request, ranked), shape=tei_rerank.ranks(ranked)
        )
    if "parameters" in data:
        return await _task_classification(request, state, data)
    predict = _body(data, tei_predict.PredictRequest)
    converted_predict = tei_predict.convert(request, predict)
    return await respond(request, state, CLASSIFY, converted_predict, shape=tei_predict.answer(predict))


async def _health(state: State) -> Response[str]:
    status, _ = overall(await model_states(state.runtime))
    if status != "ready":
        raise TeiError("unhealthy", "unhealthy")
    return Response("", status_code=200, media_type=MediaType.TEXT)


# One controller at both of TEI's model paths; each path keeps its own summary and operationId.
root = post(
    "/",
    status_code=200,
    summary="The served model's own route (TEI-compatible)",
    operation_id="Root",
    exception_handlers=TEI_ERRORS,
)(_dispatch)
invocations = post(
    "/invocations",
    status_code=200,
    summary="The served model's own route (TEI's SageMaker path)",
    operation_id="InvocationsInvocations",
    exception_handlers=TEI_ERRORS,
)(_dispatch)
ping = get(
    "/ping",
    summary="Health (TEI's SageMaker route): an empty 200 once every model is ready",
    operation_id="PingPing",
    opt={"public": True},
    exception_handlers=TEI_ERRORS,
    media_type=MediaType.TEXT,
)(_health)


@route("/", http_method=[HttpMethod.OPTIONS], include_in_schema=False, opt={"public": True})
async def root_options() -> Response[None]:
    """OPTIONS / names both of its methods. Litestar makes a path's OPTIONS answer from the
    handlers registered with its first one, and GET / and POST / are registered apart."""
    return Response(None, status_code=204, headers={"Allow": "GET, OPTIONS, POST"}, media_type=MediaType.TEXT)

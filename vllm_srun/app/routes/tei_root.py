"""POST / (text-embeddings-inference): the served model's own route, by its kind as TEI
routes it: an embedding model embeds (/embed), a classifier predicts (/predict), a reranker
reranks (/rerank) a body with a `query` and predicts any other, where TEI would refuse it.

`huggingface_hub.InferenceClient(base_url)` posts here. Its `text_classification` sends the
Inference API's task body, `{"inputs": text, "parameters": {top_k, function_to_apply}}`, and
reads a list of lists back; a body with `parameters` is answered that way (`top_k` kept,
`function_to_apply: none` for logits), any other exactly as /predict answers it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.app.routes import tei_embed, tei_predict, tei_rerank
from vllm_srun.app.routes.tei_info import kind_of
from vllm_srun.app.routes.tei_shared import TEI_ERRORS, TeiError, model_for
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


@post(
    "/",
    status_code=200,
    summary="The served model's own route (TEI-compatible)",
    exception_handlers=TEI_ERRORS,
)
async def root(
    request: Request[Any, Any, Any], data: JSONBody[dict[str, Any]], state: State
) -> Response[Any]:
    _, model = model_for(state.runtime, None)
    kind = kind_of(model)
    if kind == "embedding":
        embed = _body(data, tei_embed.EmbedRequest)
        converted = tei_embed.convert(request, embed)
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

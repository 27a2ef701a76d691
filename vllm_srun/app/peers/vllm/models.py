"""vLLM's model routes, under /vllm and /vllm/v1: a vLLM client given either as its base URL
lists this server's models there, with the same answers as /v1/models and /v1/models/{id}."""

from __future__ import annotations

from litestar import get
from litestar.datastructures import State

from vllm_srun.app.service import model_cards
from vllm_srun.app.service.model_cards import ModelCard, ModelList


@get(["/vllm/v1/models", "/vllm/models"], summary="Served models and installed plugins")
async def list_models(state: State) -> ModelList:
    listed: ModelList = await model_cards.list_models.fn(state)
    return listed


@get(
    ["/vllm/v1/models/{model_id:path}", "/vllm/models/{model_id:path}"],
    summary="One served model, by its id or an alias",
)
async def retrieve_model(state: State, model_id: str) -> ModelCard:
    card: ModelCard = await model_cards.retrieve_model.fn(state, model_id)
    return card

"""GET /v1/models (every served model, and every plugin with its distribution and version) and
GET /v1/models/{id} (one model, in OpenAI's retrieve shape).

Each model is listed once, under its id; the further names requests may use are its `aliases`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import get
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime, ServedModel
from vllm_srun.plugins.surfaces import REGISTRY


def routes_of(surfaces: list[str]) -> list[str]:
    """The paths that reach a model serving `surfaces`, from the surfaces' descriptors (a
    surface a plugin names that no descriptor describes has no route)."""
    known = set(REGISTRY.names())
    return [route.path for name in surfaces if name in known for route in REGISTRY.get(name).routes]


def describe(served: ServedModel) -> dict[str, Any]:
    """A model as /v1/models lists it: OpenAI's model object (`id`, `object`, `created`,
    `owned_by`), then its aliases, state, placement and what the family reports of it."""
    info = msgspec.to_builtins(served.model.info) if served.model is not None else {}
    entry = {
        "id": served.name,
        "object": "model",
        "created": served.created,
        "owned_by": "vllm-srun",
        "aliases": list(served.aliases),
        **served.describe(),
        **info,
    }
    if served.model is not None:
        entry["routes"] = routes_of(served.model.info.surfaces)
    return entry


@get("/v1/models", summary="Served models and installed plugins")
async def list_models(state: State) -> dict[str, Any]:
    runtime: Runtime = state.runtime
    data = [describe(served) for served in runtime.models.values()]
    return {"object": "list", "data": data, "plugins": runtime.plugins.describe()}


@get("/v1/models/{model_id:path}", summary="One served model, by its id or an alias")
async def retrieve_model(state: State, model_id: str) -> dict[str, Any]:
    # A path parameter keeps the slash of a Hugging Face id (`org/name`); it starts with one.
    runtime: Runtime = state.runtime
    return describe(runtime.named(model_id.removeprefix("/")))

"""GET /v1/models: every served model, and every plugin with its distribution and version."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import get
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime
from vllm_srun.plugins.surfaces import REGISTRY


def routes_of(surfaces: list[str]) -> list[str]:
    """The paths that reach a model serving `surfaces`, from the surfaces' descriptors (a
    surface a plugin names that no descriptor describes has no route)."""
    known = set(REGISTRY.names())
    return [route.path for name in surfaces if name in known for route in REGISTRY.get(name).routes]


@get("/v1/models", summary="Served models and installed plugins")
async def list_models(state: State) -> dict[str, Any]:
    runtime: Runtime = state.runtime
    data = []
    for name, served in runtime.models.items():
        info = msgspec.to_builtins(served.model.info) if served.model is not None else {}
        entry = {"id": name, "object": "model", "owned_by": "vllm-srun", **served.describe(), **info}
        if served.model is not None:
            entry["routes"] = routes_of(served.model.info.surfaces)
        data.append(entry)
    return {"object": "list", "data": data, "plugins": runtime.plugins.describe()}

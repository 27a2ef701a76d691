"""GET /v1/models: every served model, and every plugin with its distribution and version."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import get
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime


@get("/v1/models", summary="Served models and installed plugins")
async def list_models(state: State) -> dict[str, Any]:
    runtime: Runtime = state.runtime
    data = []
    for name, served in runtime.models.items():
        info = msgspec.to_builtins(served.model.info) if served.model is not None else {}
        data.append({"id": name, "object": "model", "owned_by": "vllm-srun", **served.describe(), **info})
    return {"object": "list", "data": data, "plugins": runtime.plugins.describe()}

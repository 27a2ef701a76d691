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
        info = msgspec.to_builtins(served.model.info)
        data.append(
            {
                "id": name,
                "object": "model",
                "owned_by": "vllm-srun",
                "state": served.state,
                "engine": served.placement.engine,
                "device": served.placement.device,
                "dtype": served.placement.dtype,
                **info,
            }
        )
    return {"object": "list", "data": data, "plugins": runtime.plugins.describe()}

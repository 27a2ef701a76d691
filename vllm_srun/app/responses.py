"""The shared tail of every surface controller: serve, then add Server-Timing."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import Timing, serve_surface


async def respond(request: Request[Any, Any, Any], state: State, surface: str, data: Any) -> Response[Any]:
    runtime: Runtime = state.runtime
    timing = Timing()
    request.scope["state"]["srun_model"] = data.model or next(iter(runtime.models), "")
    body = await serve_surface(runtime, surface, data, timing)
    return Response(body, headers={"Server-Timing": timing.header()})

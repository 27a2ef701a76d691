"""GET /health (200 only when every model can be answered) and GET /health/live."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec

from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import SrunError


async def model_states(runtime: Runtime) -> dict[str, str]:
    """Each model's state; a replica's model is ready only while a worker serves it."""
    states: dict[str, str] = {}
    for name, served in runtime.models.items():
        state = served.state
        if state == "ready" and not runtime.settings.embedded:
            try:
                if await runtime.queue.live_workers(name) == 0:
                    state = "no_worker"
            except SrunError:
                state = "redis_unavailable"
        states[name] = state
    return states


def failures(runtime: Runtime) -> dict[str, str]:
    return {name: s.reason for name, s in runtime.models.items() if s.reason}


@get(
    "/health",
    summary="Readiness: 200 only when every model is ready",
    opt={"public": True},
    responses={
        503: ResponseSpec(dict[str, Any], description="Not ready: the same body", generate_examples=False)
    },
)
async def health(state: State) -> Response[dict[str, Any]]:
    runtime: Runtime = state.runtime
    states = await model_states(runtime)
    ready = bool(states) and all(s == "ready" for s in states.values())
    body: dict[str, Any] = {"status": "ready" if ready else "not_ready", "models": states}
    if reasons := failures(runtime):
        body["reasons"] = reasons
    if runtime.redis_policy.evicting:  # ready still: the server answers, but may lose queued work
        body["redis"] = runtime.redis_policy.describe()
    return Response(body, status_code=200 if ready else 503)


@get("/health/live", summary="Liveness: the process answers", opt={"public": True})
async def live() -> dict[str, str]:
    return {"status": "alive"}

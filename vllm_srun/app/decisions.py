"""POST /v1/decisions, and POST /v1/systemone: the same surface under its other name."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.plugins.decision_surface import DecisionsRequest, DecisionsResponse


@post("/v1/decisions", status_code=200, summary="Answer typed questions about a state")
async def decisions(
    request: Request, data: JSONBody[DecisionsRequest], state: State
) -> Response[DecisionsResponse]:
    return await respond(request, state, "decisions", data)


@post("/v1/systemone", status_code=200, summary="Answer typed questions about a state (alias)")
async def systemone(
    request: Request, data: JSONBody[DecisionsRequest], state: State
) -> Response[DecisionsResponse]:
    return await respond(request, state, "decisions", data)

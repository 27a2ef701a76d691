"""POST /v1/decisions, and POST /v1/systemone: the same surface under the upstream runtime's name."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.plugins.decision_bodies import DecisionRequest, DecisionResponse
from vllm_srun.plugins.surfaces import DECISIONS


@post("/v1/decisions", status_code=200, summary="Answer typed questions about a state")
async def decisions(
    request: Request[Any, Any, Any], data: JSONBody[DecisionRequest], state: State
) -> Response[DecisionResponse]:
    return await respond(request, state, DECISIONS, data)


# "systemone" is what the upstream runtime calls its decisions endpoint; its clients keep
# working against this path (declared as the second route of the decisions descriptor).
@post("/v1/systemone", status_code=200, summary="Answer typed questions about a state (alias)")
async def systemone(
    request: Request[Any, Any, Any], data: JSONBody[DecisionRequest], state: State
) -> Response[DecisionResponse]:
    return await respond(request, state, DECISIONS, data)

"""POST /v1/classify."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import CLASSIFY, ClassifyRequest, ClassifyResponse


@post("/v1/classify", status_code=200, summary="Classify texts or text pairs")
async def classify(
    request: Request[Any, Any, Any], data: JSONBody[ClassifyRequest], state: State
) -> Response[ClassifyResponse]:
    return await respond(request, state, CLASSIFY, data)

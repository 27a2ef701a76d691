"""POST /v1/rerank."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import RERANK, RerankRequest, RerankResponse


@post("/v1/rerank", status_code=200, summary="Rank documents by relevance to a query")
async def rerank(
    request: Request[Any, Any, Any], data: JSONBody[RerankRequest], state: State
) -> Response[RerankResponse]:
    return await respond(request, state, RERANK, data)

"""POST /v1/embeddings (OpenAI-compatible)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse


@post("/v1/embeddings", status_code=200, summary="Embed texts (OpenAI-compatible)")
async def embeddings(
    request: Request[Any, Any, Any], data: JSONBody[EmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    return await respond(request, state, EMBEDDINGS, data)

"""POST /v1/embeddings (OpenAI-compatible).

OpenAI's clients read every `embedding` as a vector: an input that failed must fail the
request, never come back as a 200 with a null vector. Families answer an over-long input with a
400 themselves unless the request asked for per-item errors (`options.overflow: "reject"`);
this route holds the same promise for any family, and for failures that only show after the
forward (a failed forward, a passed deadline).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.errors import item_failure
from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse


@post("/v1/embeddings", status_code=200, summary="Embed texts (OpenAI-compatible)")
async def embeddings(
    request: Request[Any, Any, Any], data: JSONBody[EmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    if data.options.overflow is not None:  # per-item errors asked for, or truncation: as is
        return await respond(request, state, EMBEDDINGS, data)
    return await respond(request, state, EMBEDDINGS, data, shape=no_null_vectors)


def no_null_vectors(body: EmbeddingsResponse) -> EmbeddingsResponse:
    """`body` unchanged when every input has its vector; else the first failed input's error,
    naming `input[i]`, as the request's error."""
    for item in body.data:
        if item.error is not None:
            raise item_failure("input", item.index, item.error, item.message)
    return body

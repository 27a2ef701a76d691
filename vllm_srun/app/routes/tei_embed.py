"""POST /embed (text-embeddings-inference): the embeddings surface, answered as a bare list of
vectors.

`normalize: true` (TEI's default) answers unit vectors; `false` answers the pooled vector as
TEI does, before any Normalize module of a sentence-transformers package (the surface's
`options.normalize`). `inputs` takes texts or token ids (TEI's `InputType`: a list of ids is
one input), read as /v1/embeddings reads them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.app.routes.tei_shared import (
    TEI_ERRORS,
    Direction,
    Inputs,
    embeddings_request,
    raise_item_error,
)
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse


class EmbedRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /embed body."""

    inputs: Inputs
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None


def convert(request: Request[Any, Any, Any], data: EmbedRequest) -> EmbeddingsRequest:
    """The embeddings request that `data` asks for, on the model this route reaches. One pooled
    vector: a model without one (SPLADE) is TEI's 424, as TEI answers /embed there."""
    converted = embeddings_request(
        request,
        data.inputs,
        data.truncate,
        data.truncation_direction,
        data.prompt_name,
        "dense",
        dimensions=data.dimensions,
    )
    converted.options.normalize = data.normalize
    return converted


def vectors(body: EmbeddingsResponse) -> list[list[float]]:
    """The shape of /embed's answer: each input's vector, in order; any failed input fails all."""
    out: list[list[float]] = []
    for item in body.data:
        if item.error is not None:
            raise_item_error("inputs", item.index, item.error, item.message)
        assert isinstance(item.embedding, list)
        out.append(item.embedding)
    return out


@post("/embed", status_code=200, summary="Embed texts (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def embed(
    request: Request[Any, Any, Any], data: JSONBody[EmbedRequest], state: State
) -> Response[list[list[float]]]:
    return await respond(request, state, EMBEDDINGS, convert(request, data), shape=vectors)

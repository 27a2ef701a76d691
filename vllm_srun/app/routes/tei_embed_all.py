"""POST /embed_all (text-embeddings-inference): the embeddings surface with
`options.output: "tokens"`, answered as TEI does: per input, every token's last hidden state
(special tokens included, no pooling, no normalisation).

`inputs` takes texts or token ids (TEI's `InputType`), read as /v1/embeddings reads them; a
model with no token states to give (a classifier) is TEI's 424 `backend`.
"""

from __future__ import annotations

from typing import Any

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
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsResponse


class EmbedAllRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /embed_all body."""

    inputs: Inputs
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None


def token_vectors(body: EmbeddingsResponse) -> list[list[list[float]]]:
    """The shape of /embed_all's answer; any failed input fails all, as in TEI."""
    out: list[list[list[float]]] = []
    for item in body.data:
        if item.error is not None:
            raise_item_error("inputs", item.index, item.error, item.message)
        assert item.token_embeddings is not None
        out.append(item.token_embeddings)
    return out


@post(
    "/embed_all",
    status_code=200,
    summary="Every token's embedding, without pooling (TEI-compatible)",
    exception_handlers=TEI_ERRORS,
)
async def embed_all(
    request: Request[Any, Any, Any], data: JSONBody[EmbedAllRequest], state: State
) -> Response[list[list[list[float]]]]:
    converted = embeddings_request(
        request, data.inputs, data.truncate, data.truncation_direction, data.prompt_name, "tokens"
    )
    return await respond(request, state, EMBEDDINGS, converted, shape=token_vectors)

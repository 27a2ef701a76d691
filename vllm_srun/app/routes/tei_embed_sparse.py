"""POST /embed_sparse (text-embeddings-inference): the embeddings surface with
`options.output: "sparse"`, answered as TEI does: per input, the non-zero `{index, value}` pairs
of its vocabulary-sized vector, by ascending index.

A SPLADE package (a *ForMaskedLM checkpoint) answers its max-pooled log(1 + relu) weights, a
bge-m3 package its lexical weights; a model with no sparse output is TEI's 424 `backend`.
`inputs` takes texts or token ids (TEI's `InputType`), read as /v1/embeddings reads them.
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
from vllm_srun.plugins.surfaces import (
    EMBEDDINGS,
    EmbeddingsResponse,
    SparseEmbedding,
)


class EmbedSparseRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /embed_sparse body."""

    inputs: Inputs
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None


class SparseValue(msgspec.Struct):
    """One active vocabulary id and its weight (TEI's SparseValue)."""

    index: int
    value: float


def sparse_values(body: EmbeddingsResponse) -> list[list[SparseValue]]:
    """The shape of /embed_sparse's answer; any failed input fails all, as in TEI."""
    out: list[list[SparseValue]] = []
    for item in body.data:
        if item.error is not None:
            raise_item_error("inputs", item.index, item.error, item.message)
        assert isinstance(item.sparse_embedding, SparseEmbedding)
        pairs = zip(item.sparse_embedding.indices, item.sparse_embedding.values, strict=True)
        out.append([SparseValue(index=i, value=v) for i, v in pairs])
    return out


@post(
    "/embed_sparse",
    status_code=200,
    summary="Sparse embeddings: SPLADE, bge-m3 lexical weights (TEI-compatible)",
    exception_handlers=TEI_ERRORS,
)
async def embed_sparse(
    request: Request[Any, Any, Any], data: JSONBody[EmbedSparseRequest], state: State
) -> Response[list[list[SparseValue]]]:
    converted = embeddings_request(
        request, data.inputs, data.truncate, data.truncation_direction, data.prompt_name, "sparse"
    )
    return await respond(request, state, EMBEDDINGS, converted, shape=sparse_values)

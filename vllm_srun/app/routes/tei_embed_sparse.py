"""POST /embed_sparse (text-embeddings-inference): the embeddings surface with
`options.output: "sparse"`, answered as TEI does: per input, the non-zero `{index, value}` pairs
of its vocabulary-sized vector, by ascending index.

A SPLADE package (a *ForMaskedLM checkpoint) answers its max-pooled log(1 + relu) weights, a
bge-m3 package its lexical weights; a model with no sparse output is TEI's 424 `backend`.
`inputs` takes texts or token ids (TEI's `InputType`), read as /v1/embeddings reads them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.app.routes.tei_shared import (
    NON_EMPTY_LIST,
    NON_EMPTY_STR,
    TEI_ERRORS,
    Direction,
    check_batch,
    model_for,
    options,
    raise_item_error,
)
from vllm_srun.plugins.bodies import OutputKind
from vllm_srun.plugins.surfaces import (
    EMBEDDINGS,
    EmbeddingsRequest,
    EmbeddingsResponse,
    SparseEmbedding,
    TokenIds,
)

Inputs = Annotated[str, NON_EMPTY_STR] | Annotated[list[str | int | TokenIds], NON_EMPTY_LIST]


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


def convert(
    request: Request[Any, Any, Any],
    inputs: Inputs,
    truncate: bool | None,
    direction: Direction,
    prompt_name: str | None,
    output: OutputKind,
) -> EmbeddingsRequest:
    """The embeddings request for TEI's per-token routes (/embed_sparse, /embed_all): `output`
    on the model this route reaches."""
    runtime = request.app.state.runtime
    surface_options = options(runtime, truncate, direction)
    surface_options.output = output
    converted = EmbeddingsRequest(
        input=inputs if isinstance(inputs, str) else [*inputs],
        prompt_name=prompt_name,
        options=surface_options,
    )
    check_batch(runtime, len(converted.inputs()) if inputs else 0, "inputs")
    converted.model, _ = model_for(runtime, EMBEDDINGS.name)
    return converted


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
    converted = convert(
        request, data.inputs, data.truncate, data.truncation_direction, data.prompt_name, "sparse"
    )
    return await respond(request, state, EMBEDDINGS, converted, shape=sparse_values)

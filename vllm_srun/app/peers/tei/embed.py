"""TEI's embedding routes, adapters onto the embeddings surface: POST /embed (a bare list of
vectors; `normalize: false` answers the pooled vector before any Normalize module), /embed_all
(every token's last hidden state), /embed_sparse (each input's non-zero `{index, value}` pairs)
and /similarity (the cosine of `source_sentence` with each of `sentences`). `inputs` takes texts
or token ids, read as /v1/embeddings reads them; a model without the output asked is TEI's 424.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.tei.errors import TEI_ERRORS, TeiError, item_error
from vllm_srun.app.peers.tei.requests import (
    NON_EMPTY_LIST,
    Direction,
    Inputs,
    check_batch,
    embeddings_request,
    model_for,
    options,
)
from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse, SparseEmbedding


class EmbedRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /embed body."""

    inputs: Inputs
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None


def embed_request(request: Request[Any, Any, Any], data: EmbedRequest) -> EmbeddingsRequest:
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
            raise item_error("inputs", item.index, item.error, item.message)
        assert isinstance(item.embedding, list)
        out.append(item.embedding)
    return out


@post("/embed", status_code=200, summary="Embed texts (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def embed(
    request: Request[Any, Any, Any], data: JSONBody[EmbedRequest], state: State
) -> Response[list[list[float]]]:
    return await respond(request, state, EMBEDDINGS, embed_request(request, data), shape=vectors)


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
            raise item_error("inputs", item.index, item.error, item.message)
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
            raise item_error("inputs", item.index, item.error, item.message)
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


class SimilarityInput(msgspec.Struct, forbid_unknown_fields=True):
    source_sentence: str
    sentences: Annotated[list[str], NON_EMPTY_LIST]


class SimilarityParameters(msgspec.Struct, forbid_unknown_fields=True):
    truncate: bool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: str | None = None


class SimilarityRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /similarity body."""

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine of two vectors, in float64; 0 where either is all zeros."""
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm else 0.0


def similarity_request(request: Request[Any, Any, Any], data: SimilarityRequest) -> EmbeddingsRequest:
    runtime = request.app.state.runtime
    if not data.inputs.sentences:
        raise TeiError("empty", "`inputs.sentences` cannot be empty")
    texts = [data.inputs.source_sentence, *data.inputs.sentences]
    check_batch(runtime, len(texts), "inputs.sentences")
    parameters = data.parameters or SimilarityParameters()
    surface_options = options(runtime, parameters.truncate, parameters.truncation_direction)
    name, _ = model_for(runtime, EMBEDDINGS.name)
    input_: list[Any] = texts
    return EmbeddingsRequest(
        input=input_, model=name, prompt_name=parameters.prompt_name, options=surface_options
    )


def similarities(body: EmbeddingsResponse) -> list[float]:
    source, *others = vectors(body)
    return [cosine(source, other) for other in others]


@post(
    "/similarity",
    status_code=200,
    summary="Cosine similarity of a sentence with others (TEI-compatible)",
    exception_handlers=TEI_ERRORS,
)
async def similarity(
    request: Request[Any, Any, Any], data: JSONBody[SimilarityRequest], state: State
) -> Response[list[float]]:
    return await respond(request, state, EMBEDDINGS, similarity_request(request, data), shape=similarities)

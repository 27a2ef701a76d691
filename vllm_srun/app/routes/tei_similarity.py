"""POST /similarity (text-embeddings-inference): the cosine similarity of `source_sentence`
with each of `sentences`, from one embeddings request of all of them.

The body is TEI's `{inputs: {source_sentence, sentences}, parameters: {truncate,
truncation_direction, prompt_name}}` (parameters optional); the answer a list of floats, one
per sentence in order: the cosine of the vectors /v1/embeddings gives for the same texts and
prompt. The source sentence counts against the batch bound with the sentences, as in TEI.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.app.routes.tei_embed import vectors
from vllm_srun.app.routes.tei_shared import (
    NON_EMPTY_LIST,
    TEI_ERRORS,
    Direction,
    TeiError,
    check_batch,
    model_for,
    options,
)
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse


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


def convert(request: Request[Any, Any, Any], data: SimilarityRequest) -> EmbeddingsRequest:
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
    return await respond(request, state, EMBEDDINGS, convert(request, data), shape=similarities)

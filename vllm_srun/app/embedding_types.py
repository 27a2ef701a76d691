"""Quantized embeddings (`options.embedding_type`, Cohere's `embedding_types`): the pieces
`serving` puts together, and what /v1/models shows of them.

A quantized answer is made from the cached float answer, never cached itself. int8 and uint8
use each dimension's range over a fixed calibration corpus (CALIBRATION_TEXTS texts of
`vllm_srun.registry.corpus`, seed CALIBRATION_SEED), embedded once per model, layer and
normalisation, so a text's values never depend on the texts sent with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from vllm_srun.errors import InvalidRequest, Unavailable
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.embedding_types import CALIBRATED, as_base64, as_json, ranges_of
from vllm_srun.plugins.surfaces import EmbeddingsOptions, EmbeddingsRequest, EmbeddingsResponse
from vllm_srun.registry.corpus import corpus

CALIBRATION_TEXTS = 256
CALIBRATION_SEED = 11
# The calibration corpus goes to the gateway in requests of this many texts (or fewer, under
# --max-inputs), so that it shares batches with other work as any client's request does.
CALIBRATION_BATCH = 32
FIELD = "options.embedding_type"


def asked(request: Any) -> str | None:
    """The quantized type an embeddings request asks for; None for floats or another surface."""
    if not isinstance(request, EmbeddingsRequest):
        return None
    kind = request.options.embedding_type
    return None if kind in (None, "float") else kind


def normalized(model: LoadedModel, request: EmbeddingsRequest) -> bool:
    """Whether the request's vectors are unit length: `options.normalize`, else the model's."""
    if request.options.normalize is not None:
        return request.options.normalize
    return model.info.embedding is not None and model.info.embedding.normalized


def float_request(request: EmbeddingsRequest) -> EmbeddingsRequest:
    """`request` as the surface serves it before quantizing: float vectors, as JSON numbers."""
    options = msgspec.structs.replace(request.options, embedding_type=None)
    return msgspec.structs.replace(request, encoding_format="float", options=options)


def calibration_request(request: EmbeddingsRequest) -> EmbeddingsRequest:
    """The calibration corpus, embedded at `request`'s model, layer and normalisation."""
    options = EmbeddingsOptions(overflow="truncate", normalize=request.options.normalize, output="dense")
    texts: list[Any] = corpus(CALIBRATION_TEXTS, seed=CALIBRATION_SEED)
    return EmbeddingsRequest(input=texts, model=request.model, layer=request.layer, options=options)


def dense_rows(body: EmbeddingsResponse) -> np.ndarray:
    """(n, d) float32: the vectors of the inputs that have one, in order; a body without dense
    vectors (sparse, multi-vector) is the model's refusal, naming the option."""
    rows = [item.embedding for item in body.data if item.error is None]
    if any(not isinstance(row, list) for row in rows):
        raise UnsupportedOption(
            f"{FIELD}: quantizes dense vectors, which this model does not answer", param=FIELD
        )
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)


def ranges_at(vectors: np.ndarray, dimensions: int | None, unit: bool) -> np.ndarray:
    """The ranges of the calibration vectors as a request for `dimensions` sees them."""
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions].astype(np.float64)
        if unit:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms > 0, norms, 1.0)
    return ranges_of(vectors)


@dataclass
class Calibration:
    """One served model's calibration vectors per (layer, unit length), each computed once."""

    runs: dict[tuple[int | None, bool], asyncio.Task[np.ndarray]] = field(default_factory=dict)

    async def vectors(
        self, key: tuple[int | None, bool], embed: Coroutine[Any, Any, np.ndarray]
    ) -> np.ndarray:
        """The vectors for `key`: `embed` runs where no run for it is under way or done
        (a failed one runs again), else it is closed unrun and the callers share that run."""
        task = self.runs.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self.runs[key] = asyncio.ensure_future(embed)
        else:
            embed.close()
        # Shielded: a caller that leaves does not cancel the run others wait on.
        return await asyncio.shield(task)

    def ranges(self, unit: bool) -> np.ndarray | None:
        """The default ranges (last layer, full dimension) where they were computed."""
        task = self.runs.get((None, unit))
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return ranges_of(task.result())


def corpus_vectors(body: EmbeddingsResponse) -> np.ndarray:
    """The calibration corpus' vectors; every text's, or none: ranges from part of the corpus
    would differ from the ones another replica computes."""
    failed = next((item for item in body.data if item.error is not None), None)
    if failed is not None:
        raise Unavailable(
            f"{FIELD}: the calibration corpus could not be embedded ({failed.message or failed.error})"
        )
    return dense_rows(body)


def describe(calibration: Calibration, model: LoadedModel) -> dict[str, Any] | None:
    """What /v1/models shows of an embedder's output types and its calibration."""
    view = model.info.embedding
    if "embeddings" not in model.info.surfaces or view is None:
        return None
    ranges = calibration.ranges(view.normalized)
    return {
        "embedding_types": ["float", *CALIBRATED, "binary", "ubinary"],
        "calibration": {
            "corpus": "vllm_srun.registry.corpus",
            "texts": CALIBRATION_TEXTS,
            "seed": CALIBRATION_SEED,
            # Per dimension: [minimums, maximums]; null until the first int8 or uint8 request.
            "ranges": ranges.tolist() if ranges is not None else None,
        },
    }


def check_dense(request: EmbeddingsRequest) -> None:
    """A quantized type applies to dense output only, as the other fields that shape a dense
    vector only are refused (families' outputs)."""
    if request.options.output not in (None, "dense"):
        raise InvalidRequest(
            f"{FIELD}: applies to dense output only, not options.output {request.options.output!r}",
            param=FIELD,
        )


def typed_body(body: EmbeddingsResponse, request: EmbeddingsRequest, rows: np.ndarray) -> EmbeddingsResponse:
    """`body` (the float answer) with each vector replaced by its quantized row, as integers
    or (encoding_format base64) those integers as float32 bytes: OpenAI's base64 is float32,
    and every OpenAI client decodes it so, where the type's own bytes would decode as garbage."""
    remaining = iter(rows)
    for item in body.data:
        if item.error is None:
            row = next(remaining)
            if request.encoding_format == "base64":
                item.embedding = as_base64(row.astype(np.float32))
            else:
                item.embedding = as_json(row[None])[0]
    return body

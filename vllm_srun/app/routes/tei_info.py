"""GET /info (text-embeddings-inference): the served model and the server's bounds, in TEI's
fields, so TEI clients that read it to size their batches keep working.

A model's TEI kind follows its default head, as TEI's does its config: a pooled head is an
`embedding` model, a one-label sequence head a `reranker`, any other sequence head a
`classifier`.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import msgspec
from litestar import Request, get

from vllm_srun import __version__, defaults
from vllm_srun.app.routes.tei_shared import TEI_ERRORS, TeiError, model_for
from vllm_srun.app.runtime import Runtime
from vllm_srun.plugins.base import LoadedModel

Kind = Literal["embedding", "classifier", "reranker"]


def kind_of(model: LoadedModel) -> Kind:
    """The TEI kind of `model`; a model TEI has no kind for is refused (424)."""
    info = model.info
    head = info.heads[0] if info.heads else None
    if head is not None and head.kind in ("pooled", "sparse") and "embeddings" in info.surfaces:
        return "embedding"  # a SPLADE model is TEI's embedding model with splade pooling
    if head is not None and "classify" in info.surfaces and head.kind in ("sequence", "scores", "relevance"):
        return "reranker" if head.kind == "relevance" else "classifier"
    raise TeiError("backend", f"model {info.name!r} is not an embedding, classifier or reranker model")


class Info(msgspec.Struct):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, dict[str, Any]]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None


def _model_type(model: LoadedModel, kind: Kind) -> dict[str, dict[str, Any]]:
    info = model.info
    if kind == "embedding":
        pooling = info.embedding.pooling if info.embedding else "mean"
        return {kind: {"pooling": "splade" if info.heads[0].kind == "sparse" else pooling}}
    labels = info.heads[0].labels or []
    return {
        kind: {
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)},
        }
    }


@get("/info", summary="The served model (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def info(request: Request[Any, Any, Any]) -> Info:
    runtime: Runtime = request.app.state.runtime
    name, model = model_for(runtime, None)
    served = runtime.models[name]
    settings = runtime.settings
    return Info(
        model_id=name,
        model_sha=model.info.model_sha256,
        model_dtype=served.placement.dtype if served.placement else model.info.numerics,
        model_type=_model_type(model, kind_of(model)),
        max_concurrent_requests=settings.max_queued_items,
        max_input_length=model.info.max_tokens or defaults.FALLBACK_MAX_TOKENS,
        max_batch_tokens=served.limits.max_num_batched_tokens,
        max_batch_requests=served.limits.max_num_seqs,
        max_client_batch_size=settings.max_inputs,
        auto_truncate=settings.auto_truncate,
        # The tokenizers library encodes a batch on one thread per core.
        tokenization_workers=os.cpu_count() or 1,
        version=__version__,
    )

"""One surface request, from decoded body to response: plan, cache keys, queue, finish.

Controllers call `serve_surface` and nothing else. Planning (tokenising) of a large request
runs on the runtime's bounded planner threads so the event loop keeps answering small ones; a
small one plans inline, as a thread hand-off would cost it more than its tokenizing. At most
`max_concurrent_requests` are served at once per replica; the next is a 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec
import numpy as np

from vllm_srun import tracing
from vllm_srun.app import embedding_types
from vllm_srun.app.loading import ServedModel
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.tenants import current_salt
from vllm_srun.errors import Overloaded, RequestTooLarge, UnsupportedSurface
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import CacheMeta, Representation, check_profile, merged_meta, served_profile
from vllm_srun.plugins.embedding_types import CALIBRATED, quantize
from vllm_srun.plugins.surfaces import (
    EMBEDDINGS,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    Overflow,
    Surface,
    SurfaceRequest,
    finish,
)
from vllm_srun.queue import planning

# Above this many inputs, or this much text, tokenising moves off the event loop: a request
# with one long text (or many windows of it) must not hold up the small ones.
THREAD_PLAN_INPUTS = 16
THREAD_PLAN_CHARS = 2048


# The phases of `Server-Timing`, in the upstream contract's order (its ServerTiming header).
PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


@dataclass
class Timing:
    """One request's phases, in seconds, as `Server-Timing` reports them.

    `parse` reads and decodes the body (until the handler starts); `tokenize` validates,
    plans and tokenises; `queue` waits for the model, before and between forwards; `forward`
    runs them; `post` assembles the answer; `serialize` encodes the response; `total` runs from
    the request's arrival until the response is ready to send. The request edge creates it,
    the handler fills it, the edge writes the header.
    """

    started: float = field(default_factory=time.perf_counter)
    parse_s: float | None = None
    tokenize_s: float = 0.0
    queue_s: float = 0.0
    forward_s: float = 0.0
    post_s: float = 0.0
    serialize_s: float = 0.0

    def parsed(self) -> None:
        """The handler starts: the body is read and decoded."""
        self.parse_s = time.perf_counter() - self.started

    def header(self, *, body_parse: bool = True) -> str:
        """The header value now. A request whose handler never ran spent its time reading and
        decoding its body, when it has one (`body_parse`)."""
        total_s = time.perf_counter() - self.started
        parse_s = self.parse_s if self.parse_s is not None else (total_s if body_parse else 0.0)
        values = (
            parse_s,
            self.tokenize_s,
            self.queue_s,
            self.forward_s,
            self.post_s,
            self.serialize_s,
            total_s,
        )
        return ", ".join(f"{name};dur={value * 1000:.3f}" for name, value in zip(PHASES, values, strict=True))


def _check_size(runtime: Runtime, surface: Surface[Any], request: Any) -> int:
    count = surface.count(request)
    limit = runtime.settings.max_inputs
    if count > limit:
        field = surface.counted_field
        raise RequestTooLarge(f"{field}: {count} {field}; at most {limit} per request (--max-inputs)")
    return count


def _admit(runtime: Runtime, name: str, items: int, tokens: int) -> None:
    """All of a request's items, or none: the bounds on queued items and tokens per deployment."""
    queued_items, queued_tokens = runtime.queued.get(name, (0, 0))
    settings = runtime.settings
    if items > settings.max_queued_items or tokens > settings.max_queued_tokens:
        # Never admissible, however long the client waits: not a 429 to retry.
        raise RequestTooLarge(
            f"input: this request needs {items} items of {tokens} tokens; model {name!r} queues at most "
            f"{settings.max_queued_items} items and {settings.max_queued_tokens} tokens "
            "(--max-queued-items, --max-queued-tokens)"
        )
    if queued_items + items > settings.max_queued_items:
        raise Overloaded(
            f"model {name!r} has {queued_items} items queued; the bound is {settings.max_queued_items}",
            headers={"Retry-After": "1"},
        )
    if queued_tokens + tokens > settings.max_queued_tokens:
        raise Overloaded(
            f"model {name!r} has {queued_tokens} tokens queued; the bound is {settings.max_queued_tokens}",
            headers={"Retry-After": "1"},
        )
    runtime.queued[name] = (queued_items + items, queued_tokens + tokens)


def _release(runtime: Runtime, name: str, items: int, tokens: int) -> None:
    queued_items, queued_tokens = runtime.queued[name]
    runtime.queued[name] = (queued_items - items, queued_tokens - tokens)


@contextmanager
def request_slot(runtime: Runtime) -> Iterator[None]:
    """One of the replica's `max_concurrent_requests` slots, held for the block; an Overloaded
    (429, Retry-After) when all are taken. A bundle takes one for all its tasks."""
    limit = runtime.settings.max_concurrent_requests
    if runtime.in_flight >= limit:
        raise Overloaded(
            f"this replica serves {limit} requests at once (--max-concurrent-requests); retry shortly",
            headers={"Retry-After": "1"},
        )
    runtime.in_flight += 1
    try:
        yield
    finally:
        runtime.in_flight -= 1


async def serve_surface(
    runtime: Runtime,
    surface: Surface[Any],
    request: SurfaceRequest,
    timing: Timing,
    *,
    deadline_ms: float | None = None,
    slot: bool = True,
) -> Any:
    """The response Struct for `request` on `surface`; raises SrunError subclasses.

    `deadline_ms` is a deadline from outside the request (a bundle's): the earlier of it and
    the request's own `options.deadline_ms` applies. `slot=False`: the caller holds the
    request's slot (`request_slot`) already."""
    if not slot:
        return await _answer(runtime, surface, request, timing, deadline_ms)
    with request_slot(runtime):
        return await _answer(runtime, surface, request, timing, deadline_ms)


async def _answer(
    runtime: Runtime,
    surface: Surface[Any],
    request: SurfaceRequest,
    timing: Timing,
    deadline_ms: float | None,
) -> Any:
    """`_serve`; embeddings of a quantized `options.embedding_type` are made from the float
    answer, after the cache (app/embedding_types.py)."""
    served, model = runtime.model_for(request.model)
    kind = embedding_types.asked(request)
    if kind is None:
        return await _serve(runtime, served, model, surface, request, timing, deadline_ms)
    assert isinstance(request, EmbeddingsRequest)
    embedding_types.check_dense(request)
    float_request = embedding_types.float_request(request)
    body: EmbeddingsResponse = await _serve(
        runtime, served, model, surface, float_request, timing, deadline_ms
    )
    typed = await typed_vectors(runtime, served, model, request, embedding_types.dense_rows(body), [kind])
    return embedding_types.typed_body(body, request, typed[kind])


async def typed_vectors(
    runtime: Runtime,
    served: ServedModel,
    model: LoadedModel,
    request: EmbeddingsRequest,
    vectors: np.ndarray,
    kinds: list[str],
) -> dict[str, np.ndarray]:
    """`vectors` (the float answer to `request` by `model`, served as `served`) in each of
    `kinds`; int8 and uint8 on the model's calibration ranges at the request's layer,
    normalisation and dimensions."""
    ranges = None
    if any(kind in CALIBRATED for kind in kinds):
        unit = embedding_types.normalized(model, request)
        embed = _embed_corpus(runtime, served, model, request)
        corpus = await served.calibration.vectors((request.layer, unit), embed)
        ranges = embedding_types.ranges_at(corpus, request.dimensions, unit)
    return {kind: quantize(vectors, kind, ranges) for kind in kinds}


async def _embed_corpus(
    runtime: Runtime, served: ServedModel, model: LoadedModel, request: EmbeddingsRequest
) -> np.ndarray:
    """The calibration corpus at `request`'s model, layer and normalisation, served as a client
    would send it: requests of at most CALIBRATION_BATCH texts and `--max-inputs`, each with
    its own timing and no deadline."""
    corpus = embedding_types.calibration_request(request)
    texts: list[Any] = corpus.inputs()
    size = max(1, min(embedding_types.CALIBRATION_BATCH, runtime.settings.max_inputs))
    data: list[Embedding] = []
    for start in range(0, len(texts), size):
        part = msgspec.structs.replace(corpus, input=texts[start : start + size])
        body: EmbeddingsResponse = await _serve(runtime, served, model, EMBEDDINGS, part, Timing(), None)
        data.extend(body.data)
    return embedding_types.corpus_vectors(msgspec.structs.replace(body, data=data))


async def _serve(
    runtime: Runtime,
    served: ServedModel,
    model: LoadedModel,
    surface: Surface[Any],
    request: SurfaceRequest,
    timing: Timing,
    deadline_ms: float | None,
) -> Any:
    """`request` on `surface` by `model`: validated, planned, admitted, submitted, finished."""
    started = time.perf_counter()
    if surface.name not in model.info.surfaces:
        raise UnsupportedSurface(
            f"model {model.info.name!r} does not serve {surface.name} "
            f"(it serves {', '.join(model.info.surfaces)})"
        )
    surface.check_options(request.options)
    check_profile(request.options, model.info.numerics)
    count = _check_size(runtime, surface, request)
    # No overflow named: truncate under --auto-truncate, else the model's choice (see planning).
    unset: Overflow | None = "truncate" if runtime.settings.auto_truncate else None
    with tracing.span("plan", surface=surface.name, model=model.info.name, inputs=count) as planned:
        if count > THREAD_PLAN_INPUTS or surface.text_chars(request) > THREAD_PLAN_CHARS:
            plan_request = partial(planning.plan, model, surface.name, request, default_overflow=unset)
            plan = await asyncio.get_running_loop().run_in_executor(runtime.planner, plan_request)
        else:
            plan = planning.plan(model, surface.name, request, default_overflow=unset)
        planned.set(items=len(plan.items))
    timing.tokenize_s = time.perf_counter() - started
    options = request.options
    deadlines = [ms for ms in (options.deadline_ms, deadline_ms) if ms]
    deadline_s = time.time() + min(deadlines) / 1000 if deadlines else None
    timeout_s = runtime.settings.request_timeout_s
    if deadlines:
        timeout_s = min(timeout_s, min(deadlines) / 1000)
    name = model.info.name
    tokens = sum(item.tokens() for item in plan.items)
    _admit(runtime, name, len(plan.items), tokens)
    try:
        submission = await runtime.queue.submit(
            name,
            model.info.model_sha256,
            plan.items,
            numerics=model.info.numerics,
            timeout_s=timeout_s,
            deadline_s=deadline_s,
            # The caller's cache salt (app/tenants.py): "" unless several API keys keep caches apart.
            cache_salt=current_salt(),
        )
    finally:
        _release(runtime, name, len(plan.items), tokens)
    timing.queue_s, timing.forward_s = submission.queue_s, submission.forward_s
    runtime.stats.record_cache(model=name, hits=submission.hits, misses=submission.misses)
    finishing = time.perf_counter()
    with tracing.span("finish", surface=surface.name):
        body = finish(model, plan, submission.results)
    if options.return_meta:
        placement = served.placement
        info = model.info
        body.meta = merged_meta(
            body.meta,
            # The provenance the router records, for any family: what the family's own meta
            # leaves out the runtime knows (its model_id is the served name).
            model_id=info.name,
            model_sha256=info.model_sha256,
            profile=served_profile(info.numerics),
            representation=_representation(model, request),
            revision=served.revision,
            engine=placement.engine if placement else None,
            engine_paths=(await runtime.queue.workers.recent_engines(name)).get("engine_paths"),
            device=placement.device if placement else None,
            accelerator=placement.device.split(":")[0] if placement else None,
            numerics=model.info.numerics,
            queue_ms=submission.queue_s * 1000,
            compute_ms=submission.forward_s * 1000,
            cache=CacheMeta(hits=submission.hits, misses=submission.misses),
        )
    timing.post_s = time.perf_counter() - finishing
    return body


def _representation(model: LoadedModel, request: SurfaceRequest) -> Representation | None:
    """An embedding's space, as the runtime derives it when the family's meta names none: the
    model's digest, the layer asked for (else the deepest the model offers; 0 for a family
    that names no layers), the dimensions asked for (else the model's), and whether vectors
    are unit length (`options.normalize`, else the model's)."""
    view = model.info.embedding
    if not isinstance(request, EmbeddingsRequest) or view is None:
        return None
    normalize = request.options.normalize
    return Representation(
        model_sha256=model.info.model_sha256,
        layer=request.layer or max(view.layers, default=0),
        dimension=request.dimensions or view.dimension,
        normalized=view.normalized if normalize is None else normalize,
        modality="text",
    )

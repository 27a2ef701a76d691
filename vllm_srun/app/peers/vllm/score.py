"""vLLM's POST /score and /v1/score (also under /vllm): the score of each pair of texts, an
adapter onto the rerank surface. One `text_1` is scored against every `text_2`, or two lists
of the same length pair by pair; the pairs that share a `text_1` are one rerank request, run
at once with the others. The answer is vLLM's `{id, object, created, model, data: [{index,
object: "score", score}], usage}` in the pairs' order; `use_activation: false` answers logits.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.docs import operation_ids
from vllm_srun.app.peers.failures import item_failure
from vllm_srun.app.peers.vllm.truncation import PromptTokens, in_vllm_words, truncation
from vllm_srun.app.responses import client_closed, encoded, label_model, timing_of, unless_disconnected
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import Timing, request_slot, serve_surface
from vllm_srun.errors import InvalidRequest, RequestTooLarge, SrunError
from vllm_srun.plugins.surfaces import RERANK, RerankRequest, RerankResponse

Texts = str | Annotated[list[str], msgspec.Meta(min_length=1)]


class ScoreRequest(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's score body (`model` may be left out when one model is served)."""

    text_1: Texts
    text_2: Texts
    model: str | None = None
    truncate_prompt_tokens: PromptTokens = None
    use_activation: bool | None = None
    priority: int = 0


class ScoreData(msgspec.Struct):
    index: int
    object: str
    score: float


class UsageInfo(msgspec.Struct):
    """vLLM's usage (OpenAI's fields)."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(msgspec.Struct):
    id: str
    object: str
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


def pairs(data: ScoreRequest) -> list[tuple[str, str]]:
    """The pairs the body asks for, in order; an InvalidRequest naming `text_2` when two lists
    differ in length."""
    firsts = [data.text_1] if isinstance(data.text_1, str) else data.text_1
    seconds = [data.text_2] if isinstance(data.text_2, str) else data.text_2
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise InvalidRequest(
            f"text_2: {len(seconds)} texts for {len(firsts)} in text_1; give one text_1, or as many as text_2",
            param="text_2",
        )
    return list(zip(firsts, seconds, strict=True))


def requests(
    runtime: Runtime, data: ScoreRequest, scored: list[tuple[str, str]]
) -> list[tuple[RerankRequest, list[int]]]:
    """One rerank request per distinct `text_1`, and the pair index of each of its documents."""
    by_query: dict[str, list[int]] = {}
    for index, (first, _) in enumerate(scored):
        by_query.setdefault(first, []).append(index)
    out = []
    for query, indices in by_query.items():
        documents: list[Any] = [scored[i][1] for i in indices]
        rerank = RerankRequest(
            query=query,
            documents=documents,
            model=data.model,
            options=truncation(data.truncate_prompt_tokens, runtime, data.model),
        )
        out.append((rerank, indices))
    return out


def _scores(body: RerankResponse, indices: list[int], raw: bool, into: list[float]) -> None:
    for result in body.results:
        if result.error is not None:
            raise item_failure(
                "text_2", indices[result.index], result.error, result.message, words=in_vllm_words
            )
        score = result.logit if raw and result.logit is not None else result.relevance_score
        assert score is not None
        into[indices[result.index]] = score


def in_score_fields(exc: SrunError, indices: list[int]) -> SrunError:
    """A refusal of one planned rerank request, naming the score body's fields: its `query` is
    `text_1`, its `documents[i]` the pair's `text_2[indices[i]]`."""

    def field(name: str) -> str:
        if name.startswith("query"):
            return "text_1" + name[len("query") :]
        if name.startswith("documents["):
            inner, _, rest = name[len("documents[") :].partition("]")
            if inner.isdigit() and int(inner) < len(indices):
                return f"text_2[{indices[int(inner)]}]{rest}"
        return name

    if exc.param is not None:
        renamed = field(exc.param)
        if exc.message.startswith(exc.param):
            exc.message = renamed + exc.message[len(exc.param) :]
        exc.param = renamed
    return exc


async def _serve_one(
    runtime: Runtime, planned: RerankRequest, indices: list[int], timing: Timing
) -> RerankResponse:
    try:
        return await serve_surface(runtime, RERANK, planned, timing, slot=False)
    except SrunError as exc:
        raise in_score_fields(exc, indices) from None


async def _serve_all(
    runtime: Runtime, planned: list[tuple[RerankRequest, list[int]]], timing: Timing
) -> list[RerankResponse]:
    timings = [Timing() for _ in planned]
    bodies = await asyncio.gather(
        *(_serve_one(runtime, r, i, t) for (r, i), t in zip(planned, timings, strict=True))
    )
    timing.tokenize_s = sum(t.tokenize_s for t in timings)
    timing.queue_s = max(t.queue_s for t in timings)
    timing.forward_s = max(t.forward_s for t in timings)
    timing.post_s = max(t.post_s for t in timings)
    return list(bodies)


async def serve(request: Request[Any, Any, Any], state: State, data: ScoreRequest) -> Response[Any]:
    runtime: Runtime = state.runtime
    timing = timing_of(request)
    label_model(request, runtime, data.model)
    scored = pairs(data)
    if len(scored) > runtime.settings.max_inputs:
        raise RequestTooLarge(
            f"text_2: {len(scored)} pairs; at most {runtime.settings.max_inputs} per request (--max-inputs)",
            param="text_2",
        )
    planned = requests(runtime, data, scored)
    with request_slot(runtime):
        done, bodies = await unless_disconnected(request, _serve_all(runtime, planned, timing))
    if not done or bodies is None:
        return client_closed()
    scores = [0.0] * len(scored)
    for body, (_, indices) in zip(bodies, planned, strict=True):
        _scores(body, indices, data.use_activation is False, scores)
    tokens = sum(b.usage.input_tokens for b in bodies)
    answer = ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        object="list",
        created=int(time.time()),
        model=bodies[0].model,
        data=[ScoreData(index=i, object="score", score=s) for i, s in enumerate(scores)],
        usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
    )
    return encoded(answer, timing)


# vLLM serves /score and /v1/score; under /vllm too, its base URL here.
SCORE_PATHS = {
    "/score": "score_score",
    "/v1/score": "score_v1_score",
    "/vllm/score": "score_vllm_score",
    "/vllm/v1/score": "score_vllm_v1_score",
}


@post(
    list(SCORE_PATHS),
    status_code=200,
    summary="Score text pairs (vLLM-compatible)",
    operation_id=operation_ids(SCORE_PATHS),
)
async def score(
    request: Request[Any, Any, Any], data: JSONBody[ScoreRequest], state: State
) -> Response[ScoreResponse]:
    try:
        return await serve(request, state, data)
    except SrunError as exc:
        exc.message = in_vllm_words(exc.message)  # a request-level refusal, in vLLM's words
        raise

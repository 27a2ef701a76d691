"""POST /rerank (text-embeddings-inference): the rerank surface, answered as
`[{index, score, text?}]` by descending score.

`raw_scores: true` answers a cross-encoder's logit instead of its sigmoid (an embedding
model's cosine has no other form); the order is the same either way.
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
    TEI_ERRORS,
    Direction,
    check_batch,
    model_for,
    options,
    raise_item_error,
)
from vllm_srun.plugins.surfaces import RERANK, RerankRequest, RerankResponse


class TeiRerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /rerank body."""

    query: str
    texts: Annotated[list[str], NON_EMPTY_LIST]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: Direction = "Right"


class Rank(msgspec.Struct, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


def convert(request: Request[Any, Any, Any], data: TeiRerankRequest) -> RerankRequest:
    runtime = request.app.state.runtime
    check_batch(runtime, len(data.texts), "texts")
    name, _ = model_for(runtime, RERANK.name)
    return RerankRequest(
        query=data.query,
        documents=list(data.texts),
        model=name,
        options=options(runtime, data.truncate, data.truncation_direction),
    )


def ranks(data: TeiRerankRequest) -> Any:
    def shape(body: RerankResponse) -> list[Rank]:
        out: list[Rank] = []
        for result in body.results:
            if result.error is not None:
                raise_item_error("texts", result.index, result.error, result.message)
            assert result.relevance_score is not None
            score = result.logit if data.raw_scores and result.logit is not None else result.relevance_score
            text = data.texts[result.index] if data.return_text else None
            out.append(Rank(index=result.index, score=score, text=text))
        # The surface already answers by descending relevance; a logit orders the same.
        return out

    return shape


@post("/rerank", status_code=200, summary="Rerank texts (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def rerank(
    request: Request[Any, Any, Any], data: JSONBody[TeiRerankRequest], state: State
) -> Response[list[Rank]]:
    return await respond(request, state, RERANK, convert(request, data), shape=ranks(data))

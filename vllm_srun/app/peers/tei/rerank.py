"""POST /rerank: text-embeddings-inference's rerank, or vLLM's, told apart by the body. A body
with `texts` is TEI's, answered as `[{index, score, text?}]` by descending score with errors
in TEI's shape (`raw_scores: true`: a cross-encoder's logit); a body with `documents` is vLLM's
(`peers.vllm.rerank`), answered and refused as vLLM's own routes. Each shape refuses the other's
fields by name.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app import errors
from vllm_srun.app.peers.tei.errors import TEI_ERRORS, TEI_STATUSES, TeiError, TeiErrorBody, item_error
from vllm_srun.app.peers.tei.requests import NON_EMPTY_LIST, Direction, check_batch, model_for, options
from vllm_srun.app.peers.vllm import rerank as vllm_rerank
from vllm_srun.app.peers.vllm.truncation import PromptTokens
from vllm_srun.app.responses import respond
from vllm_srun.errors import InvalidRequest, SrunError
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import RERANK, RerankRequest, RerankResponse


class TeiRerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /rerank body."""

    query: str
    texts: Annotated[list[str], NON_EMPTY_LIST]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: Direction = "Right"


class RerankBody(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's rerank body (`texts`, `raw_scores`, `return_text`, `truncate`,
    `truncation_direction`) or vLLM's (`documents`, `model`, `top_n`, `return_documents`,
    `truncate_prompt_tokens`, `use_activation`, `priority`): exactly one of `texts` and
    `documents`, and only that shape's fields."""

    # The document says "exactly one" (vllm_srun.app.schemas writes `oneOf` a schema requiring each).
    one_of_required: ClassVar[tuple[str, ...]] = ("texts", "documents")

    query: str
    texts: Annotated[list[str], NON_EMPTY_LIST] | msgspec.UnsetType = msgspec.UNSET
    raw_scores: bool | msgspec.UnsetType = msgspec.UNSET
    return_text: bool | msgspec.UnsetType = msgspec.UNSET
    truncate: bool | msgspec.UnsetType | None = msgspec.UNSET
    truncation_direction: Direction | msgspec.UnsetType = msgspec.UNSET
    documents: Annotated[list[str], msgspec.Meta(min_length=1)] | msgspec.UnsetType = msgspec.UNSET
    model: str | msgspec.UnsetType | None = msgspec.UNSET
    top_n: Annotated[int, msgspec.Meta(ge=0)] | msgspec.UnsetType = msgspec.UNSET
    return_documents: bool | msgspec.UnsetType | None = msgspec.UNSET
    truncate_prompt_tokens: PromptTokens = msgspec.UNSET
    use_activation: bool | msgspec.UnsetType | None = msgspec.UNSET
    priority: int | msgspec.UnsetType = msgspec.UNSET


def _as(body: RerankBody, kind: type[Any]) -> Any:
    """`body` as one shape's request; a ValidationError naming a field of the other shape."""
    return msgspec.convert(msgspec.to_builtins(body), type=kind, strict=True)


def _stray(exc: msgspec.ValidationError) -> str:
    # "Object contains unknown field `top_n`" names the field the other shape owns.
    text = str(exc)
    return text.split("`")[1] if text.startswith("Object contains unknown field `") else "body"


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
                raise item_error("texts", result.index, result.error, result.message)
            assert result.relevance_score is not None
            score = result.logit if data.raw_scores and result.logit is not None else result.relevance_score
            text = data.texts[result.index] if data.return_text else None
            out.append(Rank(index=result.index, score=score, text=text))
        # The surface already answers by descending relevance; a logit orders the same.
        return out

    return shape


async def _vllm(request: Request[Any, Any, Any], state: State, body: RerankBody) -> Response[Any]:
    """vLLM's body, answered (errors too) as vLLM's own routes answer it."""
    try:
        try:
            data = _as(body, vllm_rerank.VllmRerankRequest)
        except msgspec.ValidationError as exc:
            field = _stray(exc)
            if field == "body":
                raise InvalidRequest(f"body: {exc}") from None
            # Every field is in the document; this one is TEI's, and this body's shape vLLM's.
            raise UnsupportedOption(
                f"{field}: not a field of a rerank body with `documents` (vLLM's); TEI's body has `texts`",
                param=field,
            ) from None
        return await vllm_rerank.serve(request, state, data)
    except SrunError as exc:
        return errors.handle_srun_error(request, exc)


# A `texts` body's errors are TEI's, a `documents` body's this app's: either body, per status.
_STATUSES = {
    status: "; ".join(d for d in (TEI_STATUSES.get(status), errors.ERROR_STATUSES.get(status)) if d)
    for status in sorted({*TEI_STATUSES, *errors.ERROR_STATUSES})
}
RESPONSES = errors.error_specs(TeiErrorBody | errors.ErrorResponse, _STATUSES)  # type: ignore[arg-type]


@post(
    "/rerank",
    status_code=200,
    summary="Rerank texts (TEI-compatible; vLLM's body with `documents`)",
    exception_handlers=TEI_ERRORS,
    responses=RESPONSES,
)
async def rerank(
    request: Request[Any, Any, Any], data: JSONBody[RerankBody], state: State
) -> Response[list[Rank] | vllm_rerank.VllmRerankResponse]:
    has_texts, has_documents = data.texts is not msgspec.UNSET, data.documents is not msgspec.UNSET
    if has_documents and not has_texts:
        return await _vllm(request, state, data)
    if not has_texts:
        raise TeiError(
            "validation", "body: missing field `texts` (TEI's) or `documents` (vLLM's)", status=422
        )
    try:
        tei = _as(data, TeiRerankRequest)
    except msgspec.ValidationError as exc:
        field = _stray(exc)
        message = f"{field}: not a field of TEI's rerank body" if field != "body" else f"body: {exc}"
        raise TeiError("validation", message, status=422) from None
    return await respond(request, state, RERANK, convert(request, tei), shape=ranks(tei))

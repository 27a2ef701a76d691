"""POST /predict (text-embeddings-inference): the classify surface, answered as TEI does:
`[{score, label}]` by descending score for one input (a text, or a pair `[a, b]`), a list of
those for a batch (`[[a], [a, b], ...]`).

`raw_scores: true` answers logits. A sigmoid head's logit is recovered from its probability;
a softmax head's probabilities fix its logits only up to a constant, so there it is refused
rather than answered with numbers TEI would not give.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.app.routes.tei_shared import (
    TEI_ERRORS,
    Direction,
    TeiError,
    check_batch,
    model_for,
    options,
    raise_item_error,
)
from vllm_srun.plugins.surfaces import CLASSIFY, ClassifyRequest, ClassifyResponse, ClassifyResult, TextPair

# TEI's own wording of the input forms it takes.
_FORMS = "a string, a pair of strings [string, string] or a batch of mixed strings and pairs [[string], [string, string], ...]"


class PredictRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /predict body."""

    inputs: str | list[Any]
    raw_scores: bool = False
    truncate: bool | None = None
    truncation_direction: Direction = "Right"


class Prediction(msgspec.Struct):
    score: float
    label: str


def _sequence(value: list[Any], where: str) -> TextPair:
    if len(value) not in (1, 2) or not all(isinstance(v, str) for v in value):
        raise TeiError("validation", f"{where}: expected {_FORMS}", status=422)
    return TextPair(text=value[0], text_pair=value[1] if len(value) == 2 else None)


def sequences(inputs: str | list[Any]) -> tuple[list[TextPair], bool]:
    """TEI's reading of `inputs`: its sequences, and whether it was a batch."""
    if isinstance(inputs, str):
        return [TextPair(text=inputs)], False
    if not inputs:
        raise TeiError("empty", "`inputs` cannot be empty")
    if isinstance(inputs[0], str):
        return [_sequence(inputs, "inputs")], False
    return [_sequence(v if isinstance(v, list) else [v], f"inputs[{i}]") for i, v in enumerate(inputs)], True


def convert(request: Request[Any, Any, Any], data: PredictRequest) -> ClassifyRequest:
    runtime = request.app.state.runtime
    pairs, _ = sequences(data.inputs)
    check_batch(runtime, len(pairs), "inputs")
    name, _ = model_for(runtime, CLASSIFY.name)
    inputs: list[str | TextPair] = [*pairs]
    return ClassifyRequest(
        input=inputs, model=name, options=options(runtime, data.truncate, data.truncation_direction)
    )


def _logit(p: float) -> float:
    p = min(max(p, 1e-300), 1.0 - 1e-16)
    return math.log(p) - math.log1p(-p)


def predictions(body: ClassifyResponse, result: ClassifyResult, raw_scores: bool) -> list[Prediction]:
    """One input's labels and scores, best first."""
    if result.error is not None:
        raise_item_error("inputs", result.index, result.error)
    if result.probabilities is not None:
        if raw_scores and result.selected is None:
            raise TeiError(
                "validation",
                f"raw_scores: head {body.head!r} answers softmax probabilities, whose logits it does not keep",
                status=422,
            )
        scores = [_logit(p) if raw_scores else p for p in result.probabilities]
        pairs = list(zip(body.labels, scores, strict=True))
    elif result.label is not None and result.score is not None:
        # A one-label head (a cross-encoder): its sigmoid, or its logit.
        pairs = [(result.label, _logit(result.score) if raw_scores else result.score)]
    else:
        raise TeiError("backend", f"head {body.head!r} does not classify whole sequences")
    ordered = sorted(pairs, key=lambda pair: -pair[1])
    return [Prediction(score=score, label=label) for label, score in ordered]


def answer(data: PredictRequest) -> Any:
    _, batch = sequences(data.inputs)

    def shape(body: ClassifyResponse) -> list[Prediction] | list[list[Prediction]]:
        each = [predictions(body, result, data.raw_scores) for result in body.results]
        return each if batch else each[0]

    return shape


@post(
    "/predict",
    status_code=200,
    summary="Classify texts or pairs (TEI-compatible)",
    exception_handlers=TEI_ERRORS,
)
async def predict(
    request: Request[Any, Any, Any], data: JSONBody[PredictRequest], state: State
) -> Response[list[Prediction] | list[list[Prediction]]]:
    return await respond(request, state, CLASSIFY, convert(request, data), shape=answer(data))

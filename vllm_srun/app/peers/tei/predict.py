"""POST /predict (text-embeddings-inference): the classify surface, answered as TEI does:
`[{score, label}]` by descending score for one input (a text, or a pair `[a, b]`), a list of
those for a batch (`[[a], [a, b], ...]`).

`raw_scores: true` answers the head's logits (the classify surface's `options.return_logits`).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.tei.errors import TEI_ERRORS, TeiError, item_error
from vllm_srun.app.peers.tei.requests import NON_EMPTY_LIST, Direction, check_batch, model_for, options
from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import CLASSIFY, ClassifyRequest, ClassifyResponse, ClassifyResult, TextPair

# TEI's own wording of the input forms it takes.
_FORMS = "a string, a pair of strings [string, string] or a batch of mixed strings and pairs [[string], [string, string], ...]"


class PredictRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /predict body."""

    inputs: str | Annotated[list[Any], NON_EMPTY_LIST]
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
    surface_options = options(runtime, data.truncate, data.truncation_direction)
    surface_options.return_logits = data.raw_scores
    return ClassifyRequest(input=inputs, model=name, options=surface_options)


def predictions(body: ClassifyResponse, result: ClassifyResult, raw_scores: bool) -> list[Prediction]:
    """One input's labels and scores, best first."""
    if result.error is not None:
        raise item_error("inputs", result.index, result.error, result.message)
    if raw_scores and result.logits is None:
        raise TeiError("backend", f"head {body.head!r} answers no logits")
    # A sequence head's probabilities, or a multi-label head's scores (those have `selected`).
    per_label = result.probabilities if result.selected is None else result.scores
    if per_label is not None:
        scores = result.logits if raw_scores else per_label
        assert scores is not None
        pairs = list(zip(body.labels, scores, strict=True))
    elif result.label is not None and result.score is not None:
        # A one-label head (a cross-encoder): its sigmoid, or its logit.
        pairs = [(result.label, result.logits[0] if raw_scores and result.logits else result.score)]
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

"""The first failed item fails the request: how a route whose API has no per-item errors
(OpenAI's, Cohere's, vLLM's, Infinity's, TEI's) answers a surface response with a failed item.

`item_failure` is the error, naming the item as the route's body names it (`texts[2]`) and said
in the API's words; TEI answers the same error in its own body (`peers.tei.errors`).
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_srun.errors import InvalidRequest, SrunError, Unavailable
from vllm_srun.plugins.surfaces import EmbeddingsResponse

# Item error codes (upstream's ItemError) that are the input's fault; any other failed on the
# server's side. The first two are an input over the model's limit.
OVER_LIMIT_CODES = frozenset({"max_length_exceeded", "scan_budget_exceeded"})
_CLIENT_ITEM_CODES = OVER_LIMIT_CODES | {"invalid_input", "invalid_question"}


def item_failure(
    field: str, index: int, code: str, message: str | None, *, words: Callable[[str], str] | None = None
) -> SrunError:
    """One input's error (its `error` code and `message`) as the whole request's: the input's
    fault is a 400 naming `field[index]`, a passed deadline or lost service a 503, anything else
    (a model output that failed its check) a 500. `words` rewrites the message in the API's words
    (its field for the way out of an over-long input)."""
    param = f"{field}[{index}]"
    text = f"{param}: {(words(message) if words else message) if message else code}"
    if code in _CLIENT_ITEM_CODES:
        return InvalidRequest(text, param=param)
    if code in ("deadline_exceeded", "unavailable"):
        return Unavailable(text, param=param)
    return SrunError(text, param=param)


def no_null_vectors(body: EmbeddingsResponse) -> EmbeddingsResponse:
    """`body` unchanged when every input has its vector; else the first failed input's error,
    naming `input[i]`, as the request's error (OpenAI's embeddings have no null vector)."""
    for item in body.data:
        if item.error is not None:
            raise item_failure("input", item.index, item.error, item.message)
    return body

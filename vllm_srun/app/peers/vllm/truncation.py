"""vLLM's `truncate_prompt_tokens`, which every vLLM route takes, as the surfaces' options, and a
refusal of an over-long input said as vLLM's body says the way out.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response
from litestar.datastructures import State

from vllm_srun.app.responses import respond
from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import InvalidRequest, SrunError
from vllm_srun.plugins.bodies import OVERFLOW_HINT, REFUSAL_HINT, UnsupportedOption, policy_words
from vllm_srun.plugins.surfaces import Options, Surface

# vLLM's truncate_prompt_tokens: -1 (the model's limit) or a positive count (0 keeps nothing).
# No one msgspec type says that, so it is decoded late (`truncation`) and documented in full.
PromptTokens = Annotated[
    Any,
    msgspec.Meta(
        extra_json_schema={
            "anyOf": [{"type": "integer", "enum": [-1]}, {"type": "integer", "minimum": 1}, {"type": "null"}]
        }
    ),
]


def truncation(value: Any, runtime: Runtime, model: str | None) -> Options:
    """vLLM's `truncate_prompt_tokens` as the surfaces' options: -1 truncates to the model's
    limit, N keeps an input's first N tokens (special tokens included), none refuses an input
    over the limit, as vLLM does. Any other value is an InvalidRequest naming the field; an N
    past the model's limit its refusal (422), as vLLM refuses one past `max_model_len`."""
    if value is None:
        return Options()
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's integer: 2.0 is one
    if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -1:
        raise InvalidRequest(
            "truncate_prompt_tokens: -1 (the model's limit) or a positive count of tokens",
            param="truncate_prompt_tokens",
        )
    if value > 0:
        _, loaded = runtime.model_for(model)
        limit = loaded.info.max_tokens
        if limit is not None and value > limit:
            raise UnsupportedOption(
                f"truncate_prompt_tokens: {value} exceeds the model's limit of {limit} tokens",
                param="truncate_prompt_tokens",
            )
    return Options(overflow="truncate", max_tokens=None if value < 0 else value)


# The surfaces' hints for an input over the limit name their options; vLLM's body has its own.
VLLM_HINT = "(set truncate_prompt_tokens to -1 to truncate it)"


def in_vllm_words(message: str) -> str:
    """`message` with the surfaces' way out of an over-long input said as vLLM's body says it."""
    return (
        message.replace(OVERFLOW_HINT, VLLM_HINT)
        .replace(REFUSAL_HINT, VLLM_HINT)
        .replace(policy_words("truncate"), "under truncate_prompt_tokens")
    )


async def respond_in_vllm_words(
    request: Request[Any, Any, Any], state: State, surface: Surface[Any], data: Any, shape: Any
) -> Response[Any]:
    """`respond`, with a request-level refusal (a surface that fails a whole request on an
    over-long input, as OpenAI-shaped embeddings do) in vLLM's words too."""
    try:
        return await respond(request, state, surface, data, shape=shape)
    except SrunError as exc:
        exc.message = in_vllm_words(exc.message)
        raise

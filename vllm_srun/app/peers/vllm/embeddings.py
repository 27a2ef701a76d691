"""vLLM's embeddings, POST /vllm/embeddings and /vllm/v1/embeddings: /v1/embeddings' body with
vLLM's fields, `truncate_prompt_tokens` (-1: the model's limit), `normalize`,
`add_special_tokens` (only its default), `priority` and `request_id` (no effect), so the /vllm
base URL serves LiteLLM's `hosted_vllm/` embeddings. Over-long inputs are refused in vLLM's words.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.peers.failures import no_null_vectors
from vllm_srun.app.peers.vllm.truncation import PromptTokens, respond_in_vllm_words, truncation
from vllm_srun.app.runtime import Runtime
from vllm_srun.errors import InvalidRequest
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse


class VllmEmbeddingsRequest(EmbeddingsRequest, forbid_unknown_fields=True):
    """vLLM's embeddings body: /v1/embeddings' with vLLM's fields added."""

    truncate_prompt_tokens: PromptTokens = None
    normalize: bool | None = None
    add_special_tokens: bool = True
    priority: int = 0
    request_id: str | None = None


def as_embeddings(runtime: Runtime, data: VllmEmbeddingsRequest) -> EmbeddingsRequest:
    """The /v1/embeddings request a vLLM body asks for. vLLM's field and the option it stands
    for are one setting: both given is an InvalidRequest naming the pair."""
    options = data.options
    if data.truncate_prompt_tokens is not None:
        if options.overflow is not None or options.max_tokens is not None:
            raise InvalidRequest(
                "truncate_prompt_tokens: give it or options.overflow/options.max_tokens, not both",
                param="truncate_prompt_tokens",
            )
        policy = truncation(data.truncate_prompt_tokens, runtime, data.model)
        options.overflow, options.max_tokens = policy.overflow, policy.max_tokens
    if data.normalize is not None:
        if options.normalize is not None and options.normalize != data.normalize:
            raise InvalidRequest("normalize: differs from options.normalize", param="normalize")
        options.normalize = data.normalize
    if not data.add_special_tokens:
        # A text's special tokens are the model's own template; ids are taken as given anyway.
        raise UnsupportedOption(
            "add_special_tokens: false is not supported (send token ids to choose every token)",
            param="add_special_tokens",
        )
    fields = {name: getattr(data, name) for name in EmbeddingsRequest.__struct_fields__}
    return EmbeddingsRequest(**fields)


async def _embeddings(
    request: Request[Any, Any, Any], data: JSONBody[VllmEmbeddingsRequest], state: State
) -> Response[EmbeddingsResponse]:
    converted = as_embeddings(state.runtime, data)
    # As POST /v1/embeddings answers it: per-item errors only when asked for.
    shape = None if converted.options.overflow is not None else no_null_vectors
    return await respond_in_vllm_words(request, state, EMBEDDINGS, converted, shape)


# One controller at both of vLLM's paths; each keeps its own summary and operationId.
embeddings = post(
    "/vllm/embeddings",
    status_code=200,
    summary="Embed texts (vLLM-compatible)",
    operation_id="VllmEmbeddingsVllmEmbeddings",
)(_embeddings)
embeddings_v1 = post(
    "/vllm/v1/embeddings",
    status_code=200,
    summary="Embed texts (vLLM-compatible, /v1 path)",
    operation_id="VllmV1EmbeddingsVllmV1Embeddings",
)(_embeddings)

"""What the TEI-shaped routes share beyond errors: TEI's truncation fields as the surfaces'
options, its batch bound, and the one served model a route without a `model` field reaches.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from litestar import Request

from vllm_srun.app.peers.tei.errors import TeiError
from vllm_srun.app.runtime import Runtime
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.bodies import Options, OutputKind, Overflow
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, TokenIds

# TEI's enum is "Left"/"Right"; huggingface_hub sends "left"/"right". Both mean the same.
Direction = Literal["Left", "Right", "left", "right"]


def options(runtime: Runtime, truncate: bool | None, direction: Direction) -> Options:
    """TEI's `truncate` and `truncation_direction` as the surfaces' options. An absent
    `truncate` is the server's `--auto-truncate`, as in TEI; without truncation an input over
    the limit is its own error, which these routes answer as TEI does (`errors.item_error`)."""
    auto = runtime.settings.auto_truncate if truncate is None else truncate
    overflow: Overflow = "truncate" if auto else "reject"
    return Options(overflow=overflow, truncation_direction="left" if direction.lower() == "left" else "right")


def model_for(runtime: Runtime, surface: str | None) -> tuple[str, LoadedModel]:
    """The model a TEI route reaches (TEI serves one model; these routes name none): the only
    model served, else the only ready one serving `surface`."""
    if len(runtime.models) == 1 or surface is None:
        served, model = runtime.model_for(None)
        return served.name, model
    serving = [
        name
        for name, served in runtime.models.items()
        if served.model is not None and surface in served.model.info.surfaces
    ]
    if len(serving) != 1:
        raise TeiError(
            "validation",
            f"this route serves one model and {len(serving) or 'no'} served models serve {surface} "
            f"({', '.join(serving) or ', '.join(runtime.models)}); serve one model per TEI-shaped server",
            status=422,
        )
    served, model = runtime.model_for(serving[0])
    return served.name, model


# A bound the document states and the route checks itself, so that breaking it gets TEI's own
# answer (400 `empty`) rather than a decoding error: msgspec writes `extra_json_schema` into the
# schema (vllm_srun.app.schemas keeps it in the document) and never enforces it.
NON_EMPTY_LIST = msgspec.Meta(extra_json_schema={"minItems": 1})
NON_EMPTY_STR = msgspec.Meta(extra_json_schema={"minLength": 1})
# What TEI's embedding routes take: a text, or a batch of texts and token ids.
Inputs = Annotated[str, NON_EMPTY_STR] | Annotated[list[str | int | TokenIds], NON_EMPTY_LIST]


def check_batch(runtime: Runtime, count: int, field: str) -> None:
    if count == 0:
        raise TeiError("empty", f"`{field}` cannot be empty")
    limit = runtime.settings.max_inputs
    if count > limit:
        raise TeiError(
            "validation", f"batch size {count} > maximum allowed batch size {limit} (--max-inputs)"
        )


def embeddings_request(
    request: Request[Any, Any, Any],
    inputs: Inputs,
    truncate: bool | None,
    direction: Direction,
    prompt_name: str | None,
    output: OutputKind,
    *,
    dimensions: int | None = None,
) -> EmbeddingsRequest:
    """The embeddings request of TEI's embedding routes (/embed, /embed_sparse, /embed_all):
    `output` of `inputs`, on the model the route reaches, the batch checked against its limit."""
    runtime = request.app.state.runtime
    surface_options = options(runtime, truncate, direction)
    surface_options.output = output
    converted = EmbeddingsRequest(
        input=inputs if isinstance(inputs, str) else [*inputs],
        dimensions=dimensions,
        prompt_name=prompt_name,
        options=surface_options,
    )
    check_batch(runtime, len(converted.inputs()) if inputs else 0, "inputs")
    converted.model, _ = model_for(runtime, EMBEDDINGS.name)
    return converted

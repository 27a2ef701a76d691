"""Plans an embeddings request: dense vectors (with a prompt, an exit layer, a dimension) or
another output (sparse, multi-vector, tokens), one row per input for the latter."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads import colbert as pylate
from vllm_srun.families.task_heads import late_chunking, outputs
from vllm_srun.families.task_heads.base import TaskHeadsBase
from vllm_srun.families.task_heads.plan_state import PlanState, SurfaceOptions
from vllm_srun.families.task_heads.sentence import at_layer, exit_layer, prompt_length, select_prompt
from vllm_srun.families.task_heads.tokenize import Encoded
from vllm_srun.families.task_heads.windows import Overflow
from vllm_srun.plugins.base import HeadInfo, Plan
from vllm_srun.plugins.bodies import REFUSAL_HINT, UnsupportedOption
from vllm_srun.plugins.surfaces import EmbeddingsRequest


def plan_embeddings(model: TaskHeadsBase, request: EmbeddingsRequest) -> Plan:
    head = model.head("embeddings", request.options.head)
    inputs = request.inputs()
    if not inputs:
        raise InvalidRequest("input: must not be empty", param="input")
    kind = request.options.output or model.outputs.default
    model.outputs.check(kind, model=model.info.name)
    if kind != outputs.DENSE:
        if request.late_chunked():
            field = "options.output" if request.options.output else "late_chunking"
            refusal = InvalidRequest if request.options.output else UnsupportedOption
            whose = "asked for" if request.options.output else f"model {model.info.name!r} gives by default"
            raise refusal(f"{field}: late chunking pools dense vectors, not the {kind!r} {whose}", param=field)
        return _plan_other_output(model, request, head, inputs, kind)
    dimension = model.info.embedding.dimension if model.info.embedding else 0
    if request.dimensions is not None and request.dimensions > dimension:
        raise UnsupportedOption(
            f"dimensions: {request.dimensions} exceeds the model's dimension {dimension}",
            param="dimensions",
        )
    layers = model.info.embedding.layers if model.info.embedding else []
    layer = exit_layer(request.layer, layers, model=model.info.name)
    plan = (
        late_chunking.plan(model, request, head, inputs)
        if request.late_chunked()
        else _plan_dense(model, request, head, inputs)
    )
    if layer is not None:
        at_layer(plan.items, layer)
    plan.state.extra = SurfaceOptions(
        dimensions=request.dimensions, encoding_format=request.encoding_format, layer=layer
    )
    return plan


def _plan_dense(
    model: TaskHeadsBase, request: EmbeddingsRequest, head: HeadInfo, inputs: list[str | list[int]]
) -> Plan:
    """One pooled vector per input (several windows' under the window policy)."""
    single, prompt, encs = _embedding_inputs(model, request, inputs)
    names = [i if isinstance(i, str) else "" for i in inputs]
    skip = 0
    if prompt and model.sentence is not None and not model.sentence.include_prompt:
        ids = model.encoder.tokenizer.encode(prompt, add_special_tokens=True).ids
        skip = prompt_length(ids, model.encoder.special_ids)
    plan = model.plan_encoded("embeddings", head, request.options, names, encs, skip=skip)
    if request.options.overflow is None:
        _refuse_overlong(model, plan.state, single=single)
    return plan


def _embedding_inputs(
    model: TaskHeadsBase, request: EmbeddingsRequest, inputs: list[str | list[int]]
) -> tuple[bool, str, list[Encoded]]:
    """(whether `input` is one input, the prompt, each input encoded): texts with the prompt
    in front, bounded in characters; token ids as given, each checked against the vocabulary."""
    # One text or one list of ids: OpenAI names the field itself, not an element of it.
    single = isinstance(request.input, str) or all(isinstance(v, int) for v in request.input)
    prompt = select_prompt(
        model.sentence,
        model=model.info.name,
        prompt=request.prompt,
        prompt_name=request.prompt_name,
        input_type=request.input_type,
        token_ids=any(isinstance(i, list) for i in inputs),
    )
    params = ["input" if single else f"input[{i}]" for i, v in enumerate(inputs) if isinstance(v, str)]
    texts = [prompt + t for t in inputs if isinstance(t, str)]
    encoded = iter(model.encode_bounded([(t, None) for t in texts], request.options, params))
    encs: list[Encoded] = []
    for index, value in enumerate(inputs):
        enc = next(encoded) if isinstance(value, str) else model.encoder.ids_input(value)
        if isinstance(enc, int):
            assert isinstance(value, list)
            param = "input" if single else f"input[{index}]"
            raise UnsupportedOption(  # the vocabulary is the model's: 422
                f"{param}: token id {value[enc]} (at {enc}) is not in the model's vocabulary of "
                f"{model.encoder.vocab_size}",
                param=param,
            )
        encs.append(enc)
    return single, prompt, encs


def _plan_other_output(
    model: TaskHeadsBase, request: EmbeddingsRequest, head: HeadInfo, inputs: list[str | list[int]], kind: str
) -> Plan:
    """Sparse, multi-vector or token embeddings: one engine row per input, read whole or
    truncated (windows would need a rule to join them that no reference has)."""
    outputs.refuse_with(
        kind,
        {
            "dimensions": request.dimensions,
            "layer": request.layer,
            "options.normalize": request.options.normalize,
            "encoding_format": "base64" if request.encoding_format == "base64" else None,
            "options.overflow": "window" if request.options.overflow == "window" else None,
        },
    )
    role = None
    if model.colbert is not None and kind == outputs.MULTI_VECTOR:
        # PyLate encodes a query or a document; input_type says which, not a prompt.
        role = request.input_type or pylate.DOCUMENT
        request = msgspec.structs.replace(request, input_type=None)
        _refuse_ids(model, inputs)
    single, _, encs = _embedding_inputs(model, request, inputs)
    names = [i if isinstance(i, str) else "" for i in inputs]
    engine_output = model.outputs.engine_output(kind)
    policy = None if role is None else model.colbert_policy(request.options, role)
    plan = model.plan_encoded(
        "embeddings", head, request.options, names, encs, output=engine_output, policy=policy
    )
    if role is not None:
        model.colbert_rows(plan.items, plan.state.inputs, role)
    if request.options.overflow is None:
        _refuse_overlong(model, plan.state, single=single, policy=policy)
    plan.state.extra = SurfaceOptions(encoding_format=request.encoding_format, output=kind)
    return plan


def _refuse_overlong(
    model: TaskHeadsBase, state: PlanState, *, single: bool, policy: Overflow | None = None
) -> None:
    """OpenAI's contract: an over-long input fails the request, never a 200 with a null
    vector, unless the request or the server asks for truncation."""
    for index, planned in enumerate(state.inputs):
        if planned.split.error is None:
            continue
        param = "input" if single else f"input[{index}]"
        budget, limit = model.budget(state.options) if policy is None else (policy.max_tokens, policy.limit)
        info = planned.split.info
        count = f"at least {info.tokens} tokens" if info.tokens_lower_bound else f"{info.tokens} tokens"
        raise InvalidRequest(f"{param}: input has {count}; {limit} {budget} {REFUSAL_HINT}", param=param)


def _refuse_ids(model: TaskHeadsBase, inputs: Sequence[str | list[int]]) -> None:
    if any(isinstance(i, list) for i in inputs):
        raise UnsupportedOption(  # the model's refusal: 422
            f"input: model {model.info.name!r} (PyLate ColBERT) encodes texts, with its prefix "
            "token; token ids are not served",
            param="input",
        )

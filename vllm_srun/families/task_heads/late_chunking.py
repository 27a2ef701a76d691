"""Late chunking on the embeddings surface: a request's texts are the chunks of one document.

The document is one work item, `[CLS] prompt chunk₁ … chunkₙ [SEP]` (each part's tokens as it
tokenizes alone, the model's special tokens around them all), whose token states come back
whole; each chunk's vector is the model's pooling over its own span of them. A document over
the model's limit is refused: late chunking never truncates or windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads import heads
from vllm_srun.families.task_heads.base import TaskHeadsBase
from vllm_srun.families.task_heads.plan_state import PlannedInput, PlanState
from vllm_srun.families.task_heads.sentence import select_prompt
from vllm_srun.families.task_heads.tokenize import FIRST, Encoded
from vllm_srun.families.task_heads.windows import CHARS_PER_TOKEN, split
from vllm_srun.plugins.base import HeadInfo, Plan, WorkItem
from vllm_srun.plugins.surfaces import EmbeddingsRequest, InputUsage

OUTPUT = "hidden"
# The document's token states are cached under their own key, never a plain request's entry.
KEY = "task_heads/hidden/late_chunking"


@dataclass(frozen=True)
class Document:
    """The chunks as one input: its encoding and each chunk's [start, end) positions in it."""

    enc: Encoded
    spans: list[tuple[int, int]]


def encode_document(model: TaskHeadsBase, chunks: Sequence[str], prompt: str) -> Document:
    """`chunks` (after `prompt`, which belongs to no chunk) as one sequence with the model's
    special tokens, as its post-processor places them around a single text."""
    enc, counts = model.encoder.encode_joined([prompt, *chunks] if prompt else chunks)
    content = np.flatnonzero(enc.seq == FIRST)  # consecutive: special tokens sit at the ends
    ends = np.cumsum(counts).tolist()
    bounds = [(end - count, end) for end, count in zip(ends, counts, strict=True)][1 if prompt else 0 :]
    spans = [
        (int(content[start]), int(content[end - 1]) + 1) if end > start else (0, 0) for start, end in bounds
    ]
    return Document(enc=enc, spans=spans)


def plan(
    model: TaskHeadsBase, request: EmbeddingsRequest, head: HeadInfo, inputs: list[str | list[int]]
) -> Plan:
    """One work item for the whole document; PlanState.chunks holds each chunk's span."""
    options = request.options
    if options.overflow == "window":
        raise InvalidRequest(
            "options.overflow: late chunking encodes the document whole, in one forward; "
            "'window' is not served with it (send each window's chunks as a document of its own)",
            param="options.overflow",
        )
    if any(isinstance(i, list) for i in inputs):
        raise InvalidRequest("input: late chunking takes the chunks as texts, not token ids", param="input")
    chunks = [i for i in inputs if isinstance(i, str)]
    prompt = select_prompt(
        model.sentence,
        model=model.info.name,
        prompt=request.prompt,
        prompt_name=request.prompt_name,
        input_type=request.input_type,
        token_ids=False,
    )
    budget, limit = model.budget(options)
    chars = sum(map(len, chunks)) + len(prompt)
    if chars > budget * CHARS_PER_TOKEN:  # refused before it is tokenized (windows.max_chars)
        raise InvalidRequest(
            f"input: the document (its {len(chunks)} chunks joined) has {chars} characters, past "
            f"any {budget} tokens; {limit} {budget} tokens, and late chunking reads a document whole",
            param="input",
        )
    document = encode_document(model, chunks, prompt)
    tokens = len(document.enc)
    if tokens > budget:
        raise InvalidRequest(
            f"input: the document (its {len(chunks)} chunks joined, with the special tokens) has "
            f"{tokens} tokens; {limit} {budget}, and late chunking reads a document whole: "
            "split it into documents that fit",
            param="input",
        )
    empty = next((i for i, (start, end) in enumerate(document.spans) if end == start), None)
    if empty is not None:
        param = "input" if isinstance(request.input, str) else f"input[{empty}]"
        raise InvalidRequest(f"{param}: a chunk without tokens has no vector to pool", param=param)
    item = WorkItem(token_ids=document.enc.ids.tolist(), output=OUTPUT, key_extra=KEY)
    whole = split(document.enc, model.policy(options))
    planned = PlannedInput(text="", enc=document.enc, split=whole, items=[0])
    state = PlanState(head=head, output=OUTPUT, options=options, inputs=[planned], chunks=document.spans)
    return Plan(surface="embeddings", items=[item], state=state)


def chunk_vectors(
    model: TaskHeadsBase, chunks: Sequence[tuple[int, int]], states: np.ndarray, *, normalize: bool
) -> list[np.ndarray]:
    """Each chunk's vector from the document's token states: the model's pooling over the
    chunk's span, then the package's modules after pooling (Dense, Normalize)."""
    vectors = []
    for start, end in chunks:
        keep = np.zeros(states.shape[0], dtype=bool)
        keep[start:end] = True
        pooled = heads.pool_tokens(states, keep, model.pooling or "mean")
        vectors.append(model.post_pooling(pooled, final_normalize=normalize))
    return vectors


def chunk_usage(chunks: Sequence[tuple[int, int]]) -> list[InputUsage]:
    """Each chunk's tokens, as its `input` field reports them."""
    return [
        InputUsage(tokens=end - start, processed_tokens=end - start, truncated=False) for start, end in chunks
    ]

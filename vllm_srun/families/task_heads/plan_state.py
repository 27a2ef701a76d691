"""What a task_heads plan keeps for its finish: each input's text, tokens, split and work items.
Kept on the replica that planned, never serialised."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from vllm_srun.families.task_heads.tokenize import Encoded
from vllm_srun.families.task_heads.windows import Split
from vllm_srun.plugins.base import HeadInfo
from vllm_srun.plugins.surfaces import Options


@dataclass(eq=False)
class PlannedInput:
    """One input of a request: its text, tokens, how it was split and its work items."""

    text: str
    enc: Encoded
    split: Split
    items: list[int]
    # A PyLate ColBERT row's role ("query" or "document", colbert.py): its row holds a prefix
    # token and, for a query, expansion tokens beyond `enc`'s.
    role: str | None = None


class SurfaceOptions(TypedDict, total=False):
    """The request fields finish needs beyond `Options`, by surface: embeddings' `dimensions`,
    `encoding_format` and `layer` (the exit used), rerank's `top_n` and `return_documents`.
    Absent means the default."""

    dimensions: int | None
    encoding_format: str
    top_n: int | None
    return_documents: bool
    layer: int | None
    output: str  # options.output in force (outputs.py): absent means dense


@dataclass(eq=False)
class PlanState:
    """What finish needs from plan."""

    head: HeadInfo
    output: str
    options: Options
    inputs: list[PlannedInput]
    query: PlannedInput | None = None  # rerank by embedding cosine: the query's own input
    extra: SurfaceOptions = field(default_factory=SurfaceOptions)
    # Leading positions that pooling leaves out: a prompt, under a Pooling with include_prompt
    # false. The engine then returns token states ("hidden") and finish pools them.
    skip: int = 0
    # Late chunking (late_chunking.py): the one input is the document, whose token states are
    # its row; each chunk's [start, end) positions in it, one answer per chunk.
    chunks: list[tuple[int, int]] | None = None

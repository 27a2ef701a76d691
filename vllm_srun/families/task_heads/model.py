"""`TaskHeadsModel`: plans classify, embeddings and rerank requests into work items and
finishes the engine's raw rows into responses. It holds a tokenizer, never weights, so an app
replica can plan and finish without torch or onnxruntime."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_srun.errors import InvalidRequest, UnsupportedSurface
from vllm_srun.families.task_heads import finish
from vllm_srun.families.task_heads.base import TaskHeadsBase
from vllm_srun.families.task_heads.plan_classify import plan_classify
from vllm_srun.families.task_heads.plan_embeddings import plan_embeddings
from vllm_srun.families.task_heads.plan_rerank import plan_rerank
from vllm_srun.families.task_heads.plan_state import PlannedInput, PlanState
from vllm_srun.plugins.base import ItemError, Plan, Result
from vllm_srun.plugins.bodies import check_profile
from vllm_srun.plugins.surfaces import ClassifyRequest, EmbeddingsRequest, RerankRequest


def _fits(shape: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(shape) == len(expected) and all(
        e is None or s == e for s, e in zip(shape, expected, strict=True)
    )


class TaskHeadsModel(TaskHeadsBase):
    """A BERT or ModernBERT model with a task head, on the classify/embeddings/rerank surfaces."""

    def plan_surface(self, surface: str, request: Any) -> Plan:
        if surface not in self.info.surfaces:
            raise UnsupportedSurface(
                f"model {self.info.name!r} does not serve {surface!r}; it serves "
                f"{', '.join(self.info.surfaces) or 'nothing'}"
            )
        check_profile(request.options, self.info.numerics)
        if surface == "classify" and isinstance(request, ClassifyRequest):
            return plan_classify(self, request)
        if surface == "embeddings" and isinstance(request, EmbeddingsRequest):
            return plan_embeddings(self, request)
        if surface == "rerank" and isinstance(request, RerankRequest):
            return plan_rerank(self, request)
        raise InvalidRequest(f"a {surface} request was expected, got {type(request).__name__}")

    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> Any:
        # Never a fall-through to some surface's response: a plan this model did not make is a bug.
        if plan.surface not in ("classify", "embeddings", "rerank") or not isinstance(plan.state, PlanState):
            raise UnsupportedSurface(f"model {self.info.name!r} cannot finish a {plan.surface!r} plan")
        if len(results) != len(plan.items):
            raise ValueError(f"{len(results)} results for {len(plan.items)} work items")
        state = plan.state
        rows = [self._rows(planned, results, state.output) for planned in state.inputs]
        if plan.surface == "classify":
            return finish.classify(self, state, rows)
        if plan.surface == "embeddings":
            return finish.embeddings(self, state, rows)
        query = self._rows(state.query, results, state.output) if state.query is not None else None
        return finish.rerank(self, state, rows, query)

    def _rows(
        self, planned: PlannedInput, results: Sequence[Result], output: str
    ) -> list[np.ndarray] | ItemError:
        """One input's rows, or the error that answers it: its own, or its first failed item's."""
        if planned.split.error is not None:
            return planned.split.error
        rows: list[np.ndarray] = []
        for index, piece in zip(planned.items, planned.split.pieces, strict=True):
            result = results[index]
            if isinstance(result, ItemError):
                return result
            tokens = len(piece) if planned.role is None or self.colbert is None else (
                self.colbert.row_length(len(piece), planned.role)
            )
            expected = self._shape(output, tokens)
            if not _fits(tuple(result.shape), expected):
                return ItemError(
                    "invalid_model_output",
                    f"engine returned shape {tuple(result.shape)} for {output!r}, expected {expected}",
                )
            rows.append(result)
        return rows

    def _shape(self, output: str, tokens: int) -> tuple[int | None, ...]:
        """The shape a row of `output` has; None where any size is right (a sparse row's
        active ids, a projection's width)."""
        if output == "splade":
            return (None, 2)
        if output == "lexical":
            return (tokens,)
        if output == "colbert":
            return (tokens, None)
        if output == "logits":
            return (len(self.labels),)
        if output == "token_logits":
            return (tokens, len(self.labels))
        if output == "hidden":
            return (tokens, self.hidden_size)
        return (self.hidden_size,)

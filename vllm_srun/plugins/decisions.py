"""`DecisionModel`: a LoadedModel that answers `/v1/decisions`.

The base owns the endpoint contract; a family writes `plan` (a request's questions -> work
items) and `answer` (one question's readout). Validation, the start-up self-check and
per-question metrics are completed by the decisions work (issue 5).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from vllm_srun.plugins.base import LoadedModel, Plan, Result


class DecisionModel(LoadedModel):
    """A model that answers typed questions about a state."""

    @abc.abstractmethod
    def plan(self, request: Any) -> Plan:
        """A decisions request's questions as work items."""

    @abc.abstractmethod
    def answer(self, question: Any, results: Sequence[Result]) -> Any:
        """One question's answer from the results of its work items."""

    def plan_surface(self, surface: str, request: Any) -> Plan:
        return self.plan(request)

    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> Any:
        questions: list[tuple[Any, slice]] = plan.state
        return [self.answer(question, results[span]) for question, span in questions]

"""`NliDecisionModel`: a DecisionModel over an NLI cross-encoder.

Each question becomes (premise = the state's text, hypothesis) pairs (see `templates`); each
pair is one work item asking for the sequence logits. The items of a question over a state
are the same tokens every time, so the result cache answers a repeated question at once.
Only `tokenizers` is used here: an app replica plans and finishes without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from vllm_srun.defaults import FALLBACK_MAX_TOKENS
from vllm_srun.errors import InvalidRequest, PackageError
from vllm_srun.families.nli_decisions import templates
from vllm_srun.families.nli_decisions.presets import PRESETS
from vllm_srun.plugins.base import EngineModel, ModelInfo, WorkItem
from vllm_srun.plugins.decision_bodies import QUESTION_TYPES, DecisionState, Question
from vllm_srun.plugins.decisions import DecisionModel, QuestionError
from vllm_srun.plugins.surfaces import Options

# Enters every item's cache key: the same tokens read as NLI logits by this family.
KEY_EXTRA = "nli"


def _tokenizer(tokenizer_json: str, *, truncate_to: int | None) -> Tokenizer:
    try:
        tok = Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # the tokenizers library raises plain Exceptions
        raise PackageError(f"tokenizer.json cannot be loaded: {exc}") from exc
    # The engine packs rows without padding; truncation is ours to decide (options.overflow).
    tok.no_padding()
    if truncate_to is None:
        tok.no_truncation()
    else:
        tok.enable_truncation(truncate_to, strategy="only_first")
    return tok


class NliDecisionModel(DecisionModel):
    """Answers choice, noul, score and set questions with entailment scores of an NLI model,
    and the family's presets (`presets.PRESETS`). It reads one bounded input per hypothesis:
    no scan budget (`options.max_tokens` is refused), text only."""

    question_types = (*QUESTION_TYPES, "set")
    presets = PRESETS

    # Rows are packed without padding, but the engines' float reductions still vary with
    # batch composition at the last ulp, so the coalescer's batching window applies.
    batch_invariant = False

    def __init__(
        self,
        info: ModelInfo,
        engine_model: EngineModel | None,
        *,
        tokenizer_json: str,
        entailment: int,
        contradiction: int,
        uses_type_ids: bool,
    ) -> None:
        super().__init__(info, engine_model)
        self.max_tokens = info.max_tokens or FALLBACK_MAX_TOKENS
        # Two tokenizers, as truncation is tokenizer state and planning runs on several threads.
        self.plain = _tokenizer(tokenizer_json, truncate_to=None)
        self.truncating = _tokenizer(tokenizer_json, truncate_to=self.max_tokens)
        self.entailment = entailment
        self.contradiction = contradiction
        self.uses_type_ids = uses_type_ids

    def tokenizer(self) -> Tokenizer:
        return self.plain

    def plan(self, state: DecisionState, question: Question, options: Options) -> list[WorkItem]:
        if options.overflow == "window":
            raise InvalidRequest("options.overflow: 'window' is not supported by /v1/decisions")
        if options.window is not None:  # as task_heads refuses it: never silently ignored
            raise InvalidRequest("options.window: applies only with options.overflow 'window'")
        pairs = [(state.text, h) for h in templates.hypotheses(question)]
        encodings = self.plain.encode_batch(pairs, add_special_tokens=True)
        longest = max(len(e.ids) for e in encodings)
        if longest > self.max_tokens:
            if options.overflow_mode == "reject":
                raise QuestionError(
                    "max_length_exceeded",
                    f"state and hypothesis take {longest} tokens; the model takes {self.max_tokens} "
                    "(options.overflow: 'truncate' shortens the state)",
                )
            try:
                encodings = self.truncating.encode_batch(pairs, add_special_tokens=True)
            except Exception as exc:  # only the hypothesis is left and it is still too long
                raise QuestionError(
                    "max_length_exceeded", f"a hypothesis alone exceeds {self.max_tokens} tokens: {exc}"
                ) from exc
        return [
            WorkItem(
                token_ids=list(e.ids),
                type_ids=list(e.type_ids) if self.uses_type_ids else None,
                output="logits",
                key_extra=KEY_EXTRA,
            )
            for e in encodings
        ]

    def answer(self, question: Question, results: Sequence[np.ndarray]) -> np.ndarray:
        scores = templates.entailment_scores(results, self.entailment, self.contradiction)
        return templates.probabilities(question, scores)

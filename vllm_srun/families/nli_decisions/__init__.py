"""The `nli_decisions` family: NLI cross-encoders answering `/v1/decisions` questions."""

from vllm_srun.families.nli_decisions.family import NliDecisionsFamily

__all__ = ["NliDecisionsFamily"]

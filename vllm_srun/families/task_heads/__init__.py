"""The `task_heads` family: BERT and ModernBERT encoders with classification, tagging,
embedding and reranking heads."""

from vllm_srun.families.task_heads.family import TaskHeadsFamily

__all__ = ["TaskHeadsFamily"]

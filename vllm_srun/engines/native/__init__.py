"""The native PyTorch engine: one module per architecture, packed batches, no padding compute."""

from vllm_srun.engines.native.engine import NativeEngine

__all__ = ["NativeEngine"]

"""The onnxruntime engine: CPU inference of a package's ONNX graph."""

from vllm_srun.engines.onnxruntime.engine import OnnxEngineModel, OnnxRuntimeEngine

__all__ = ["OnnxEngineModel", "OnnxRuntimeEngine"]

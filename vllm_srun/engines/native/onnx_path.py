"""The small-batch path on onnxruntime: the dense forward exported once at load, run by ORT.

For one row or a few rows of similar length, onnxruntime's CPU kernels run the same BERT
forward faster than eager PyTorch (fewer dispatches, fused elementwise work around the
matmuls); for large mixed batches the packed path wins (bench/single_forward.py measures
both). The graph is exported from the loaded module itself (its `dense_bert` forward, so the
numbers are the native ones up to float rounding) into a private temporary folder that is
deleted once onnxruntime has read it; nothing the package ships is run. onnxruntime holds
its own copy of the weights, the one extra copy the engine allows itself for this path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vllm_srun.engines.native.bert import BertBackbone


def available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


class OnnxSmallBatch:
    """An onnxruntime session over `dense_bert` of one loaded backbone; `hidden` runs it."""

    def __init__(self, backbone: BertBackbone, threads: int) -> None:
        import onnxruntime as ort
        import torch

        from vllm_srun.engines.native.dense import dense_bert

        class Graph(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = backbone

            def forward(self, ids: torch.Tensor, types: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
                mask = (1.0 - valid[:, None, None, :].float()) * torch.finfo(torch.float32).min
                return dense_bert(self.bert, ids, types, mask)

        example = torch.ones(2, 8, dtype=torch.long)
        axes = {0: "rows", 1: "width"}
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle pool threads sleep rather than spin, as torch's do here (see vllm_srun.tuning):
        # a spinning pool starves the event loop and Redis on a busy machine.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Through a file rather than bytes in memory: the graph holds a copy of the weights, and
        # a second transient copy in this process would stay in its heap after the load.
        with tempfile.TemporaryDirectory(prefix="vllm-srun-onnx-") as folder:
            path = str(Path(folder) / "dense.onnx")
            # The legacy (TorchScript) exporter: one self-contained graph, no extra dependencies.
            with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(
                    Graph().eval(),
                    (example, torch.zeros_like(example), example),
                    path,
                    input_names=["input_ids", "token_type_ids", "attention_mask"],
                    output_names=["hidden"],
                    dynamic_axes={
                        "input_ids": axes,
                        "token_type_ids": axes,
                        "attention_mask": axes,
                        "hidden": axes,
                    },
                    opset_version=17,
                    dynamo=False,
                )
            self.session: Any = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        _return_freed_memory()

    def hidden(self, ids: np.ndarray, types: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Hidden states [rows, width, hidden] of right-padded int64 `ids`, `types`, `valid`."""
        feed = {"input_ids": ids, "token_type_ids": types, "attention_mask": valid}
        (out,) = self.session.run(["hidden"], feed)
        return np.asarray(out)


def _return_freed_memory() -> None:
    """Hand the export's freed temporaries back to the OS (glibc keeps them in the heap
    otherwise, and the process's RSS would count them); nothing where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass

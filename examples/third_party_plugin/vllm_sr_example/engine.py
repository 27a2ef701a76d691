"""`example_counts`: an engine whose "network" counts term ids.

For every row of a batch it returns a histogram of the row's token ids over the model's
vocabulary. It runs the `keyword-counts` architecture only, on the CPU or `example_host`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_srun.plugins.base import Batch, Device, Engine, EngineModel, ModelSpec

ARCHITECTURE = "keyword-counts"


class CountsModel(EngineModel):
    def __init__(self, vocab_size: int, device: Device, dtype: str) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.dtype = dtype

    def encode(self, batch: Batch) -> list[np.ndarray]:
        return [
            np.bincount(batch.row(i), minlength=self.vocab_size).astype(np.float32) for i in range(len(batch))
        ]


class CountsEngine(Engine):
    auto_priority = 50
    dtypes = ("float32",)

    def supports(self, spec: ModelSpec, device: Device) -> str | None:
        if spec.architecture != ARCHITECTURE:
            return f"runs {ARCHITECTURE!r} only"
        if device.accelerator not in ("cpu", "example_host"):
            return "runs on cpu or example_host only"
        return None

    def load(self, spec: ModelSpec, device: Device, dtype: str, host: Any) -> CountsModel:
        return CountsModel(int(spec.config["vocab_size"]), device, dtype)

    def descriptor(self) -> dict[str, Any]:
        return {**super().descriptor(), "architectures": [ARCHITECTURE]}

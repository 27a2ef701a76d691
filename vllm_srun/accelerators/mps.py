"""Apple GPUs through torch's MPS backend. Unavailable (not an error) elsewhere."""

from __future__ import annotations

import sys
from typing import Any

from vllm_srun.accelerators._torch import torch_or_none
from vllm_srun.plugins.base import Accelerator, Device


class MpsAccelerator(Accelerator):
    auto_priority = 10

    def available(self) -> bool:
        if sys.platform != "darwin":  # Metal is Apple's alone: no torch import to learn that
            return False
        torch = torch_or_none()
        backend = getattr(getattr(torch, "backends", None), "mps", None)
        return bool(backend is not None and backend.is_available())

    def devices(self) -> list[Device]:
        return [Device("mps")] if self.available() else []

    def descriptor(self) -> dict[str, Any]:
        # An app replica must not import torch just to describe its plugins: probe only once
        # torch is loaded (a worker, or `vllm-srun plugins`, which loads it to probe).
        probed = "torch" in sys.modules
        return {
            "name": self.name,
            "available": self.available() if probed else None,
            "auto_priority": self.auto_priority,
        }

    def torch_device(self, device: Device) -> Any:
        import torch

        return torch.device("mps")

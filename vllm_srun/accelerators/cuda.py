"""NVIDIA GPUs through torch. Unavailable (not an error) without torch or without a GPU."""

from __future__ import annotations

import sys
from typing import Any

from vllm_srun.accelerators._torch import cpu_only_build, torch_or_none
from vllm_srun.plugins.base import Accelerator, Device


class CudaAccelerator(Accelerator):
    auto_priority = 0

    def available(self) -> bool:
        if "torch" not in sys.modules and cpu_only_build():
            return False
        torch = torch_or_none()
        return bool(torch is not None and torch.cuda.is_available())

    def devices(self) -> list[Device]:
        torch = torch_or_none()
        if torch is None or not torch.cuda.is_available():
            return []
        return [Device("cuda", i) for i in range(torch.cuda.device_count())]

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

        return torch.device("cuda", device.index or 0)

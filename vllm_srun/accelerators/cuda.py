"""NVIDIA GPUs through torch. Unavailable (not an error) without torch or without a GPU."""

from __future__ import annotations

from typing import Any

from vllm_srun.accelerators._torch import torch_or_none
from vllm_srun.plugins.base import Accelerator, Device


class CudaAccelerator(Accelerator):
    auto_priority = 0

    def available(self) -> bool:
        torch = torch_or_none()
        return bool(torch is not None and torch.cuda.is_available())

    def devices(self) -> list[Device]:
        torch = torch_or_none()
        if torch is None or not torch.cuda.is_available():
            return []
        return [Device("cuda", i) for i in range(torch.cuda.device_count())]

    def torch_device(self, device: Device) -> Any:
        import torch

        return torch.device("cuda", device.index or 0)

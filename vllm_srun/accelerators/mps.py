"""Apple GPUs through torch's MPS backend. Unavailable (not an error) elsewhere."""

from __future__ import annotations

from typing import Any

from vllm_srun.accelerators._torch import torch_or_none
from vllm_srun.plugins.base import Accelerator, Device


class MpsAccelerator(Accelerator):
    auto_priority = 10

    def available(self) -> bool:
        torch = torch_or_none()
        backend = getattr(getattr(torch, "backends", None), "mps", None)
        return bool(backend is not None and backend.is_available())

    def devices(self) -> list[Device]:
        return [Device("mps")] if self.available() else []

    def torch_device(self, device: Device) -> Any:
        import torch

        return torch.device("mps")

"""The host CPU: always available, chosen last by `device: auto`. It runs bfloat16 and int8 only
where its instruction sets have them (cpu_features.py)."""

from __future__ import annotations

from typing import Any

from vllm_srun.accelerators.cpu_features import host_refusal
from vllm_srun.plugins.base import Accelerator, Device


class CpuAccelerator(Accelerator):
    auto_priority = 100

    def available(self) -> bool:
        return True

    def devices(self) -> list[Device]:
        return [Device("cpu")]

    def torch_device(self, device: Device) -> Any:
        import torch

        return torch.device("cpu")

    def dtype_refusal(self, dtype: str, device: Device) -> str | None:
        return host_refusal(dtype)

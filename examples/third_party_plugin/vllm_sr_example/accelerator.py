"""`example_host`: the host CPU presented as a device of its own.

It has no `auto_priority`, so the runtime uses it only when it is named (`--device example_host`).
It offers the CPU as its torch device, so torch engines such as the built-in native engine run
on it as well as the example's own counting engine.
"""

from __future__ import annotations

from typing import Any

from vllm_srun.plugins.base import Accelerator, Device


class HostAccelerator(Accelerator):
    def available(self) -> bool:
        return True

    def devices(self) -> list[Device]:
        return [Device("example_host")]

    def torch_device(self, device: Device) -> Any:
        import torch  # only engines that run torch ask, so the example needs torch only then

        return torch.device("cpu")

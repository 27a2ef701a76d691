"""`example_host`: the host CPU presented as a device of its own.

It has no `auto_priority`, so the runtime uses it only when it is named (`--device example_host`).
"""

from __future__ import annotations

from vllm_srun.plugins.base import Accelerator, Device


class HostAccelerator(Accelerator):
    def available(self) -> bool:
        return True

    def devices(self) -> list[Device]:
        return [Device("example_host")]

"""The GPU accelerators tell that they are unavailable without importing torch where that is
certain (a CPU-only torch build, Metal off macOS): a process serving no torch model, such as the
example keyword model on its own engine, never pays for the import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_keywords

from vllm_srun.accelerators._torch import cpu_only_build

PROBE = """
import sys
from vllm_srun.accelerators.cuda import CudaAccelerator
from vllm_srun.accelerators.mps import MpsAccelerator
print(CudaAccelerator().available(), MpsAccelerator().available(), "torch" in sys.modules)
"""

LOAD = """
import sys
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.loader import ModelOptions, load_model

model, placement = load_model(load_plugins(), ModelOptions(ref=sys.argv[1]), with_engine=True)
print(placement.device, placement.engine, "torch" in sys.modules)
"""

pytestmark = pytest.mark.skipif(
    not (cpu_only_build() and sys.platform == "linux"), reason="needs a CPU-only torch build on Linux"
)


def fresh(code: str, *args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1].split()  # its last line: logs may come before


def test_gpu_accelerators_answer_without_importing_torch() -> None:
    assert fresh(PROBE) == ["False", "False", "False"]


def test_the_keyword_model_loads_on_the_cpu_without_torch(tmp_path: Path) -> None:
    device, engine, imported = fresh(LOAD, str(write_keywords(tmp_path / "kw")))
    assert (device, imported) == ("cpu", "False"), (device, engine, imported)


def test_once_torch_is_imported_cuda_asks_it() -> None:
    """With torch already loaded the answer is torch's own (here: no GPU), not the version's."""
    import torch

    from vllm_srun.accelerators.cuda import CudaAccelerator

    assert CudaAccelerator().available() is torch.cuda.is_available()

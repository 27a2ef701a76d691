"""The native engine builds its modules on the meta device without running their random init:
a meta tensor passes through `torch.nn.init` untouched (its first Python decomposition would
import torch._dynamo, seconds of every load), while a real tensor is initialised as before; and
it moves them to their device without torch's to_empty, whose decomposition imports sympy."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from vllm_srun.engines.native.weights import meta_build  # noqa: E402

LOAD = """
import sys
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.loader import ModelOptions, load_model

model, placement = load_model(load_plugins(), ModelOptions(ref=sys.argv[1]), with_engine=True)
assert placement.engine == "native", placement
print("dynamo imported" if "torch._dynamo" in sys.modules else "dynamo not imported")
print("sympy imported" if "sympy" in sys.modules else "sympy not imported")
"""


def test_a_native_load_never_imports_dynamo(tmp_path: Path) -> None:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    package = write_fixture(tmp_path / "emb", variant="bert-embedding")
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(package)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # Nor sympy, which torch's to_empty imports for meta tensors (weights.materialize).
    assert done.stdout.strip().splitlines()[-2:] == ["dynamo not imported", "sympy not imported"], done.stdout


def test_meta_tensors_skip_init_and_real_ones_do_not() -> None:
    originals = {name: getattr(torch.nn.init, name) for name in ("normal_", "kaiming_uniform_", "ones_")}
    with meta_build():
        linear = torch.nn.Linear(8, 4)
        real = torch.zeros(4096, device="cpu")
        torch.nn.init.normal_(real)
        ones = torch.nn.init.ones_(torch.empty(3, device="cpu"))
    assert linear.weight.is_meta
    assert 0.9 < float(real.std()) < 1.1, "a real tensor is initialised inside a meta build"
    assert ones.tolist() == [1.0, 1.0, 1.0]
    assert {name: getattr(torch.nn.init, name) for name in originals} == originals, "restored on exit"
    # Outside, modules are built and initialised as torch builds them.
    assert float(torch.nn.Linear(64, 64).weight.detach().abs().sum()) > 0


def test_another_threads_module_is_initialised_during_a_meta_build() -> None:
    built: list[torch.nn.Linear] = []
    inside, go_on = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait(10)
        built.append(torch.nn.Linear(64, 64, device="cpu"))
        go_on.set()

    thread = threading.Thread(target=other)
    thread.start()
    with meta_build():
        inside.set()
        assert go_on.wait(10)
    thread.join(10)
    weight = built[0].weight
    assert not weight.is_meta and float(weight.std()) > 0.01, "initialised by kaiming_uniform_ as always"
    # A failure inside restores the originals too.
    with pytest.raises(RuntimeError), meta_build():
        raise RuntimeError("boom")
    assert torch.nn.init.normal_.__module__ == "torch.nn.init"

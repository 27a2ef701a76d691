"""Shared harness for the native engine's parity tests against the Transformers reference.

Tiny random models are saved with `save_pretrained` (safetensors), loaded back through
`NativeEngine.read` + `load` with a ModelSpec built from config.json, and compared with the
Transformers forward on right-padded batches with attention masks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vllm_srun.engines.native import NativeEngine  # noqa: E402
from vllm_srun.engines.native.engine import NativeModel  # noqa: E402
from vllm_srun.plugins.base import Batch, Device, ModelSpec, WorkItem  # noqa: E402

# Inputs whose lengths differ and (for ModernBERT's window of 8) exceed the local window.
LENGTHS = (5, 23, 1, 40, 12, 31)


def randomize(model: Any, seed: int = 0) -> Any:
    """Every parameter drawn afresh, so zero biases or unit norms cannot hide a wiring mistake."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.eval()


def spec_from_dir(path: Path) -> ModelSpec:
    config = json.loads((path / "config.json").read_text())
    return ModelSpec(
        family="test",
        architecture=config["architectures"][0],
        config=config,
        weight_files=tuple(sorted(path.glob("*.safetensors"))),
    )


def load_native(path: Path, dtype: str = "float32") -> NativeModel:
    engine = NativeEngine()
    spec = spec_from_dir(path)
    assert engine.supports(spec, Device("cpu")) is None
    return engine.load(spec, Device("cpu"), dtype, engine.read(spec, dtype))


def save(model: Any, path: Path) -> Path:
    model.save_pretrained(path, safe_serialization=True)
    return path


def token_rows(vocab: int, lengths: Sequence[int] = LENGTHS, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # Ids from 3 up: 0..2 are pad/cls/sep in the tiny ModernBERT configs.
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


def padded(rows: Sequence[Sequence[int]]) -> tuple[Any, Any]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def reference(
    model: Any, rows: Sequence[Sequence[int]], type_rows: Sequence[Sequence[int]] | None = None
) -> Any:
    """The Transformers forward on a right-padded batch; returns the output object."""
    ids, mask = padded(rows)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if type_rows is not None:
        kwargs["token_type_ids"] = padded(type_rows)[0]
    with torch.no_grad():
        return model(**kwargs)


def encode(
    native: NativeModel,
    rows: Sequence[Sequence[int]],
    outputs: Sequence[str] | str,
    type_rows: Sequence[Sequence[int]] | None = None,
) -> list[np.ndarray]:
    kinds = [outputs] * len(rows) if isinstance(outputs, str) else list(outputs)
    items = [
        WorkItem(token_ids=list(r), output=k, type_ids=None if type_rows is None else list(type_rows[i]))
        for i, (r, k) in enumerate(zip(rows, kinds, strict=True))
    ]
    return native.encode(Batch.from_items(items))


def assert_close(actual: np.ndarray, expected: Any, atol: float = 1e-4) -> None:
    expected = expected.detach().float().numpy() if hasattr(expected, "detach") else expected
    assert actual.dtype == np.float32
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=0)


def assert_rows_match_solo(native: NativeModel, rows: Sequence[Sequence[int]], kinds: Sequence[str]) -> None:
    """Each row of a mixed batch equals the same row run alone (within 1e-5)."""
    batched = encode(native, rows, kinds)
    for row, kind, got in zip(rows, kinds, batched, strict=True):
        (solo,) = encode(native, [row], kind)
        np.testing.assert_allclose(got, solo, atol=1e-5, rtol=0)


@pytest.fixture(autouse=True)
def _few_threads() -> Any:
    # Tiny models: threading costs more than it gains and adds run-to-run noise.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def nt() -> SimpleNamespace:
    """The helpers above, as a fixture: test modules cannot import a rootless conftest reliably."""
    return SimpleNamespace(
        randomize=randomize,
        spec_from_dir=spec_from_dir,
        load_native=load_native,
        save=save,
        token_rows=token_rows,
        padded=padded,
        reference=reference,
        encode=encode,
        assert_close=assert_close,
        assert_rows_match_solo=assert_rows_match_solo,
        LENGTHS=LENGTHS,
    )

"""Harness for the task_heads family: fixture packages, engines, and the Transformers reference.

Fixture packages (with ONNX graphs) are written once per session. Tests run every surface the
way the server does: `plan_surface` -> `LoadedModel.run(items)` (one batch) -> `finish_surface`,
and compare with Transformers (eager attention, float32) at atol 1e-4.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from vllm_srun.families.task_heads import TaskHeadsFamily
from vllm_srun.plugins.base import Device, ItemError, LoadedModel
from vllm_srun.plugins.package import ModelPackage


def _native_importable() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    try:
        from vllm_srun.engines.native import NativeEngine  # noqa: F401
    except ImportError:
        return False
    return True


# The ONNX engine always runs these tests; the native engine joins when it imports.
ENGINES = ["onnxruntime", *(["native"] if _native_importable() else [])]
ATOL = 1e-4


def make_engine(name: str) -> Any:
    if name == "native":
        from vllm_srun.engines.native import NativeEngine

        return NativeEngine()
    from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine

    return OnnxRuntimeEngine()


class Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.family = TaskHeadsFamily()
        self._models: dict[tuple[str, str | None], LoadedModel] = {}
        self._refs: dict[str, Any] = {}

    def package(self, variant: str) -> Path:
        from vllm_srun.testing.task_heads_fixtures import write_fixture

        path = self.root / variant
        if not (path / "config.json").exists():
            write_fixture(path, variant=variant, onnx=True)
        return path

    def load_path(self, path: Path, engine: str | None, name: str = "m") -> LoadedModel:
        package = ModelPackage(path)
        assert self.family.detect(package)
        verification = self.family.verify(package)
        spec = self.family.describe(package)
        engine_model = None
        if engine is not None:
            runner = make_engine(engine)
            reason = runner.supports(spec, Device("cpu"))
            if reason is not None:
                pytest.skip(f"{engine} cannot run {spec.architecture}: {reason}")
            engine_model = runner.load(spec, Device("cpu"), "float32", runner.read(spec, "float32"))
        return self.family.load(
            package, spec, engine_model, name=name, verification=verification, numerics="float32"
        )

    def load(self, variant: str, engine: str | None) -> LoadedModel:
        key = (variant, engine)
        if key not in self._models:
            self._models[key] = self.load_path(self.package(variant), engine, name=variant)
        return self._models[key]

    @staticmethod
    def roundtrip(model: LoadedModel, surface: str, request: Any, tamper: Any = None) -> Any:
        """plan -> one run over every item -> finish; `tamper(results)` may inject item errors."""
        plan = model.plan_surface(surface, request)
        results: list[Any] = list(model.run(plan.items)) if plan.items else []
        if tamper is not None:
            results = tamper(results)
        return model.finish_surface(plan, results)

    def hf(self, path: Path) -> Any:
        import torch
        import transformers

        key = str(path)
        if key not in self._refs:
            config = json.loads((path / "config.json").read_text())
            cls = getattr(transformers, config["architectures"][0])
            model = cls.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32)
            self._refs[key] = model.eval()
        return self._refs[key]

    def reference(
        self, path: Path, rows: Sequence[Sequence[int]], type_rows: Sequence[Sequence[int]] | None = None
    ) -> list[np.ndarray]:
        """Transformers outputs per row (logits [L], token logits [T, L] or hidden [T, H]) from one
        right-padded batch."""
        import torch

        model = self.hf(path)
        width = max(len(r) for r in rows)
        pad = int(model.config.pad_token_id or 0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        types = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            if type_rows is not None:
                types[i, : len(row)] = torch.tensor(type_rows[i])
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if model.config.model_type == "bert":
            kwargs["token_type_ids"] = types
        with torch.no_grad():
            out = model(**kwargs)
        if hasattr(out, "logits"):
            logits = out.logits.numpy()
            if logits.ndim == 2:
                return [logits[i] for i in range(len(rows))]
            return [logits[i, : len(r)] for i, r in enumerate(rows)]
        hidden = out.last_hidden_state.numpy()
        return [hidden[i, : len(r)] for i, r in enumerate(rows)]


@pytest.fixture(scope="session")
def th(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    return Harness(tmp_path_factory.mktemp("task-heads"))


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def _few_threads() -> Iterator[None]:
    # Tiny models on a 2-core machine: threads cost more than they give and add noise.
    if importlib.util.find_spec("torch") is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def helpers() -> SimpleNamespace:
    """Small helpers as a fixture: test modules cannot import a rootless conftest reliably."""

    def fail_item(index: int, code: str = "forward_failed") -> Any:
        def tamper(results: list[Any]) -> list[Any]:
            results[index] = ItemError(code, "injected")
            return results

        return tamper

    return SimpleNamespace(ATOL=ATOL, ENGINES=ENGINES, fail_item=fail_item)

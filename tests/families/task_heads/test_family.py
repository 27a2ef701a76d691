"""family.py: loading a package into a model, with or without an engine, torch or onnxruntime."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from families.task_heads.harness import Harness

from vllm_srun.errors import PackageError
from vllm_srun.plugins.surfaces import EmbeddingsRequest


def test_family_plans_and_finishes_without_torch_or_onnxruntime(th: Harness) -> None:
    path = th.plan_package("bert-token")
    code = f"""
import sys
sys.modules["torch"] = None
sys.modules["onnxruntime"] = None
from vllm_srun.families.task_heads import TaskHeadsFamily
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import ClassifyRequest
f = TaskHeadsFamily()
p = ModelPackage({str(path)!r})
m = f.load(p, f.describe(p), None, name="x", verification=f.verify(p), numerics="float32")
plan = m.plan_surface("classify", ClassifyRequest(input="John lives in Paris"))
import numpy as np
out = m.finish_surface(plan, [np.zeros((len(i.token_ids), 5), np.float32) for i in plan.items])
assert out.results[0].spans is not None
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_token_ids_past_the_vocabulary_are_refused_at_load(th: Harness, tmp_path: Path) -> None:
    path = tmp_path / "big-ids"
    shutil.copytree(th.plan_package("bert-sequence"), path)
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] -= 1  # the tokenizer's last id no longer has an embedding row
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PackageError, match=r"tokenizer\.json .* token ids; config\.json's vocab_size"):
        th.load_path(path, None)


@pytest.mark.torch
def test_an_onnx_only_package_runs_on_onnxruntime_by_default(th: Harness, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.registry.loader import ModelOptions, load_model

    path = tmp_path / "onnx-only"
    shutil.copytree(th.package("bert-embedding"), path)
    (path / "model.safetensors").unlink()
    loaded, placement = load_model(load_plugins(), ModelOptions(ref=str(path)), with_engine=True)
    assert placement.engine == "onnxruntime"
    out = th.roundtrip(loaded, "embeddings", EmbeddingsRequest(input="hello"))  # type: ignore[arg-type]
    reference = th.roundtrip(
        th.load("bert-embedding", "native"), "embeddings", EmbeddingsRequest(input="hello")
    )
    np.testing.assert_allclose(out.data[0].embedding, reference.data[0].embedding, atol=1e-4)

"""layout.py: which files a package is served from, and which packages the family refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from families.task_heads.harness import ATOL, TEXTS, Harness, rows_of, unit

from vllm_srun.errors import PackageError
from vllm_srun.plugins.package import ModelPackage, combined_sha256
from vllm_srun.plugins.surfaces import EmbeddingsRequest
from vllm_srun.testing.task_heads_fixtures import VARIANTS


@pytest.mark.torch
@pytest.mark.parametrize("variant", VARIANTS)
def test_verify_and_describe_name_every_loaded_file(th: Harness, variant: str) -> None:
    path = th.package(variant)
    package = ModelPackage(path)
    assert th.family.detect(package)
    verification = th.family.verify(package)
    expected = {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
        "onnx/model.onnx",
    }
    if "embedding" in variant:
        expected |= {"modules.json", "1_Pooling/config.json"}
    assert set(verification.files) == expected
    assert verification.model_sha256 == combined_sha256(dict(verification.files))
    assert verification.max_tokens == 128
    spec = th.family.describe(package)
    config = json.loads((path / "config.json").read_text())
    assert spec.family == "task_heads" and spec.architecture == config["architectures"][0]
    assert spec.weight_files == ((path / "model.safetensors").resolve(),)
    assert spec.extra["onnx"] == str((path / "onnx" / "model.onnx").resolve())


def test_detect_refuses_other_packages(th: Harness, tmp_path: Path) -> None:
    src = th.plan_package("bert-embedding")
    for name, edit in {
        "unknown": lambda c: c.update(model_type="acme"),  # no table row covers it, no ONNX graph
        "mismatch": lambda c: c.update(model_type="roberta"),  # BertModel is not a RoBERTa class
    }.items():
        dst = tmp_path / name
        shutil.copytree(src, dst)
        config = json.loads((dst / "config.json").read_text())
        edit(config)
        (dst / "config.json").write_text(json.dumps(config))
        assert not th.family.detect(ModelPackage(dst))
        with pytest.raises(PackageError, match=r"model_type .* is not one the native engine knows.*onnx/model.onnx.*register_model"):
            th.family.verify(ModelPackage(dst))
    plain = tmp_path / "no-modules"
    shutil.copytree(src, plain)
    (plain / "modules.json").unlink()
    assert not th.family.detect(ModelPackage(plain))  # a bare BertModel has no head to serve
    assert not th.family.detect(ModelPackage(tmp_path))


def test_a_masked_lm_checkpoint_with_modules_json_is_an_embedder(th: Harness, tmp_path: Path) -> None:
    """sentence-transformers packages often name *ForMaskedLM: the encoder serves, the LM head
    is not read."""
    dst = tmp_path / "mlm"
    shutil.copytree(th.plan_package("bert-embedding"), dst)
    config = json.loads((dst / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (dst / "config.json").write_text(json.dumps(config))
    assert th.family.detect(ModelPackage(dst))


def test_pickled_checkpoint_alone_is_refused(th: Harness, tmp_path: Path) -> None:
    dst = tmp_path / "pickled"
    shutil.copytree(th.plan_package("bert-sequence"), dst)
    (dst / "model.safetensors").rename(dst / "pytorch_model.bin")
    assert not (dst / "onnx").exists()  # an ONNX graph would be served instead
    with pytest.raises(PackageError, match=r"pytorch_model\.bin.*safetensors"):
        th.family.verify(ModelPackage(dst))


def test_unsupported_sentence_transformers_module_is_refused(th: Harness, tmp_path: Path) -> None:
    dst = tmp_path / "dense"
    shutil.copytree(th.plan_package("bert-embedding"), dst)
    modules = json.loads((dst / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (dst / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(PackageError, match="Dense"):
        th.family.verify(ModelPackage(dst))


@pytest.mark.torch
def test_last_token_pooling(th: Harness, engine: str, tmp_path: Path) -> None:
    dst = tmp_path / "last"
    shutil.copytree(th.package("bert-embedding"), dst)
    pooling = json.loads((dst / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_lasttoken=True)
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    model = th.load_path(dst, engine)
    request = EmbeddingsRequest(input=TEXTS)
    out = th.roundtrip(model, "embeddings", request)
    rows, _ = rows_of(model, "embeddings", request)
    for data, h in zip(out.data, th.reference(dst, rows), strict=True):
        np.testing.assert_allclose(data.embedding, unit(h[-1].astype(np.float64)), atol=ATOL)

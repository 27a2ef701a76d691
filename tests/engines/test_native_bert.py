"""BERT on the native engine: parity with Transformers (atol 1e-4), weights errors, batching."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from helpers import minilm_dir  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from vllm_srun.engines.native import NativeEngine  # noqa: E402
from vllm_srun.errors import ConfigError, PackageError  # noqa: E402
from vllm_srun.plugins.base import Accelerator, Device, ModelSpec  # noqa: E402

VOCAB = 100


def bert_config(**overrides: Any) -> Any:
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return transformers.BertConfig(**(settings | overrides))


@pytest.fixture
def type_rows(nt: Any) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 2, size=n).tolist() for n in nt.LENGTHS]


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
@pytest.mark.parametrize("with_types", [False, True])
def test_bert_model_matches_transformers(
    nt: Any, tmp_path: Path, act: str, with_types: bool, type_rows: Any
) -> None:
    hf = nt.randomize(transformers.BertModel(bert_config(hidden_act=act)))
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)
    types = type_rows if with_types else None
    ref = nt.reference(hf, rows, types).last_hidden_state
    hidden = nt.encode(native, rows, "hidden", types)
    means = nt.encode(native, rows, "default", types)  # a bare encoder defaults to mean pooling
    for i, row in enumerate(rows):
        n = len(row)
        nt.assert_close(hidden[i], ref[i, :n])
        nt.assert_close(means[i], ref[i, :n].mean(0))
    for kind, pick in (("cls", lambda r, n: r[0]), ("last", lambda r, n: r[n - 1])):
        for i, got in enumerate(nt.encode(native, rows, kind, types)):
            nt.assert_close(got, pick(ref[i], len(rows[i])))


@pytest.mark.parametrize(
    "overrides",
    [{"num_labels": 3}, {"num_labels": 5, "problem_type": "multi_label_classification"}],
    ids=["single_label", "multi_label"],
)
def test_bert_sequence_classification(
    nt: Any, tmp_path: Path, overrides: dict[str, Any], type_rows: Any
) -> None:
    hf = nt.randomize(transformers.BertForSequenceClassification(bert_config(**overrides)))
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows, type_rows).logits
    for kind in ("logits", "default"):
        for i, got in enumerate(nt.encode(native, rows, kind, type_rows)):
            nt.assert_close(got, ref[i])


def test_bert_token_classification(nt: Any, tmp_path: Path) -> None:
    hf = nt.randomize(transformers.BertForTokenClassification(bert_config(num_labels=4)))
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).logits
    for kind in ("token_logits", "default"):
        for i, got in enumerate(nt.encode(native, rows, kind)):
            nt.assert_close(got, ref[i, : len(rows[i])])


def test_mixed_batch_rows_equal_solo_runs(nt: Any, tmp_path: Path) -> None:
    hf = nt.randomize(transformers.BertForSequenceClassification(bert_config(num_labels=3)))
    native = nt.load_native(nt.save(hf, tmp_path))
    kinds = ["logits", "hidden", "mean", "cls", "last", "default"]
    nt.assert_rows_match_solo(native, nt.token_rows(VOCAB), kinds)


def test_prefixed_bare_model_loads(nt: Any, tmp_path: Path) -> None:
    """A BertModel whose tensors carry the "bert." prefix loads like the bare form."""
    hf = nt.randomize(transformers.BertModel(bert_config()))
    path = nt.save(hf, tmp_path)
    weights = path / "model.safetensors"
    save_file({f"bert.{k}": v for k, v in load_file(weights).items()}, weights)
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).last_hidden_state
    for i, got in enumerate(nt.encode(nt.load_native(path), rows, "hidden")):
        nt.assert_close(got, ref[i, : len(rows[i])])


def _load_with(nt: Any, path: Path, edit: Any) -> None:
    engine, spec = NativeEngine(), nt.spec_from_dir(path)
    host = engine.read(spec, "float32")
    edit(host)
    engine.load(spec, Device("cpu"), "float32", host)


def test_missing_tensor_is_named(nt: Any, tmp_path: Path) -> None:
    path = nt.save(nt.randomize(transformers.BertForSequenceClassification(bert_config())), tmp_path)
    with pytest.raises(PackageError, match=r"bert\.encoder\.layer\.1\.output\.dense\.weight"):
        _load_with(nt, path, lambda host: host.pop("bert.encoder.layer.1.output.dense.weight"))
    with pytest.raises(PackageError, match=r"pooler\.dense\.bias"):
        _load_with(nt, path, lambda host: host.pop("bert.pooler.dense.bias"))
    with pytest.raises(PackageError, match=r"self\.key\.weight"):
        _load_with(nt, path, lambda host: host.pop("bert.encoder.layer.0.attention.self.key.weight"))


def test_unexpected_or_misshapen_tensor_is_refused(nt: Any, tmp_path: Path) -> None:
    path = nt.save(nt.randomize(transformers.BertForSequenceClassification(bert_config())), tmp_path)
    with pytest.raises(PackageError, match=r"unexpected tensor 'bert\.encoder\.layer\.0\.extra\.weight'"):
        _load_with(nt, path, lambda host: host.update({"bert.encoder.layer.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(PackageError, match=r"classifier\.weight.*shape"):
        _load_with(nt, path, lambda host: host.update({"classifier.weight": torch.zeros(7, 32)}))
    # Same shape, not floating point: copying would cast it into weights without a word.
    for dtype in (torch.int32, torch.bool):
        with pytest.raises(PackageError, match=r"classifier\.bias.*expected a floating-point"):
            _load_with(
                nt,
                path,
                lambda host, d=dtype: host.update({"classifier.bias": host["classifier.bias"].to(d)}),
            )


def test_unknown_architecture_lists_known_ones(tmp_path: Path) -> None:
    spec = ModelSpec(family="test", architecture="GPT2Model", config={})
    reason = NativeEngine().supports(spec, Device("cpu"))
    assert reason is not None and "BertModel" in reason and "ModernBertForTokenClassification" in reason
    with pytest.raises(ConfigError, match=r"known: .*BertForSequenceClassification"):
        NativeEngine().load(spec, Device("cpu"), "float32", {})


class NoTorch(Accelerator):
    name = "no_torch"

    def available(self) -> bool:
        return True

    def devices(self) -> list[Device]:
        return [Device("no_torch", provider=self)]


def test_supports_refuses_accelerators_without_a_torch_device_and_missing_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = ModelSpec(
        family="test", architecture="BertModel", config={}, weight_files=(Path("model.safetensors"),)
    )
    engine = NativeEngine()
    assert engine.supports(spec, Device("cpu")) is None
    (no_torch,) = NoTorch().devices()
    assert "has no torch device" in (engine.supports(spec, no_torch) or "")
    assert "no accelerator named 'nowhere'" in (engine.supports(spec, Device("nowhere")) or "")
    onnx_only = ModelSpec(family="test", architecture="BertModel", config={})
    assert engine.supports(onnx_only, Device("cpu")) == "the package has no safetensors weights"
    monkeypatch.setitem(sys.modules, "torch", None)
    assert engine.supports(spec, Device("cpu")) == "torch is not installed"


def test_engine_module_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from vllm_srun.engines.native import NativeEngine\n"
        "from vllm_srun.plugins.base import Device, ModelSpec\n"
        "spec = ModelSpec(family='t', architecture='BertModel', config={})\n"
        "print(NativeEngine().supports(spec, Device('cpu')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "torch is not installed"


def test_bfloat16_returns_float32_close_to_reference(nt: Any, tmp_path: Path) -> None:
    hf = nt.randomize(transformers.BertForSequenceClassification(bert_config(num_labels=3)))
    native = nt.load_native(nt.save(hf, tmp_path), dtype="bfloat16")
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).logits
    for i, got in enumerate(nt.encode(native, rows, "logits")):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, ref[i].numpy(), atol=0.15, rtol=0.05)


def test_all_minilm_l6_v2_matches_transformers(nt: Any) -> None:
    from tokenizers import Tokenizer

    path = minilm_dir()
    assert json.loads((path / "config.json").read_text())["architectures"] == ["BertModel"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    texts = [
        "A man is playing a guitar.",
        "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up.",
        "Hi",
        "Encoders turn sentences into vectors that can be compared with cosine similarity.",
    ]
    rows = [tokenizer.encode(t).ids for t in texts]
    native = nt.load_native(path)
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    ref = nt.reference(hf, rows).last_hidden_state
    hidden = nt.encode(native, rows, "hidden")
    means = nt.encode(native, rows, "mean")
    for i, row in enumerate(rows):
        nt.assert_close(hidden[i], ref[i, : len(row)])
        nt.assert_close(means[i], ref[i, : len(row)].mean(0))


@pytest.mark.parametrize(
    "name", ["gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh"]
)
def test_in_place_activations_equal_the_plain_ones(name: str) -> None:
    from vllm_srun.engines.native.layers import activation

    x = torch.randn(64, 48) * 3
    expected = activation(name)(x)
    target = x.clone()
    result = activation(name, in_place=True)(target)
    assert torch.equal(result, expected) and torch.equal(target, expected)


def test_a_config_that_cannot_build_the_model_names_the_file(nt: Any, tmp_path: Path) -> None:
    path = nt.save(nt.randomize(transformers.BertForSequenceClassification(bert_config())), tmp_path)
    engine, spec = NativeEngine(), nt.spec_from_dir(path)
    host = engine.read(spec, "float32")
    for change, message in (
        ({"hidden_size": None}, r"config\.json has no 'hidden_size'"),
        ({"num_attention_heads": 0}, r"config\.json does not describe a valid BertForSequenceClassification"),
        ({"intermediate_size": -4}, r"config\.json does not describe a valid"),
    ):
        config = {k: v for k, v in spec.config.items() if k not in change or change[k] is not None}
        config.update({k: v for k, v in change.items() if v is not None})
        broken = ModelSpec(
            family=spec.family, architecture=spec.architecture, config=config, weight_files=spec.weight_files
        )
        with pytest.raises(PackageError, match=message):
            engine.load(broken, Device("cpu"), "float32", host)


def test_an_unreadable_weight_file_is_named(nt: Any, tmp_path: Path) -> None:
    path = nt.save(nt.randomize(transformers.BertForSequenceClassification(bert_config())), tmp_path)
    spec = nt.spec_from_dir(path)
    weights = spec.weight_files[0]
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    with pytest.raises(PackageError, match=rf"{weights.name} is not a readable safetensors file"):
        NativeEngine().read(spec, "float32")

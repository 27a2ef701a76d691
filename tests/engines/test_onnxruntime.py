"""The onnxruntime engine: per-row outputs against Transformers (atol 1e-4), graph safety checks,
a session shared by threads, and agreement with the native engine."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine
from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import Batch, Device, ModelSpec, WorkItem

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

CPU = Device("cpu")
ATOL = 1e-4
LENGTHS = (5, 23, 1, 40, 12, 31)  # mixed, and past ModernBERT's local window of 8


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("onnx-fixtures")

    def get(variant: str) -> Path:
        path = root / variant
        if not path.exists():
            write_fixture(path, variant=variant, onnx=True)
        return path

    return get


def _spec(path: Path, onnx_path: Path | None = None) -> ModelSpec:
    config = json.loads((path / "config.json").read_text())
    graph = onnx_path or path / "onnx" / "model.onnx"
    return ModelSpec(
        family="task_heads",
        architecture=config["architectures"][0],
        config=config,
        weight_files=(path / "model.safetensors",),
        extra={"onnx": str(graph)},
    )


def _load(path: Path) -> Any:
    engine = OnnxRuntimeEngine()
    spec = _spec(path)
    assert engine.supports(spec, CPU) is None
    return engine.load(spec, CPU, "float32", engine.read(spec, "float32"))


def _rows(vocab: int, lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab, size=n).tolist() for n in lengths]


def _types(rows: list[list[int]]) -> list[list[int]]:
    # Pairs: the second half of each row is the second text.
    return [[0] * (len(r) // 2) + [1] * (len(r) - len(r) // 2) for r in rows]


def _reference(path: Path, rows: list[list[int]], types: list[list[int]] | None) -> Any:
    config = json.loads((path / "config.json").read_text())
    model = (
        getattr(transformers, config["architectures"][0])
        .from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32)
        .eval()
    )
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(config["pad_token_id"]), dtype=torch.long)
    mask = torch.zeros_like(ids)
    type_ids = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        if types is not None:
            type_ids[i, : len(row)] = torch.tensor(types[i])
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if config["model_type"] == "bert":
        kwargs["token_type_ids"] = type_ids
    with torch.no_grad():
        out = model(**kwargs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def _encode(model: Any, rows: list[list[int]], kinds: list[str], types: list[list[int]] | None = None) -> Any:
    items = [
        WorkItem(token_ids=r, output=k, type_ids=None if types is None else types[i])
        for i, (r, k) in enumerate(zip(rows, kinds, strict=True))
    ]
    return model.encode(Batch.from_items(items))


def _vocab(path: Path) -> int:
    return min(int(json.loads((path / "config.json").read_text())["vocab_size"]) - 10, 200)


# Outputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["bert-embedding", "modernbert-embedding"])
def test_hidden_and_pooled_rows_match_transformers(fixture_dir: Any, variant: str) -> None:
    path = fixture_dir(variant)
    model = _load(path)
    rows = _rows(_vocab(path))
    types = _types(rows) if variant.startswith("bert") else None
    kinds = ["hidden", "mean", "cls", "last", "mean", "hidden"]
    ref = _reference(path, rows, types)
    for row, kind, got, hidden in zip(rows, kinds, _encode(model, rows, kinds, types), ref, strict=True):
        h = hidden[: len(row)]
        expected = {"hidden": h, "mean": h.mean(0), "cls": h[0], "last": h[-1]}[kind]
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "variant", ["bert-sequence", "bert-token", "modernbert-sequence", "modernbert-token"]
)
def test_logits_match_transformers(fixture_dir: Any, variant: str) -> None:
    path = fixture_dir(variant)
    model = _load(path)
    rows = _rows(_vocab(path))
    types = _types(rows) if variant.startswith("bert") else None
    kind = "token_logits" if variant.endswith("token") else "logits"
    ref = _reference(path, rows, types)
    for row, got, expected in zip(rows, _encode(model, rows, [kind] * len(rows), types), ref, strict=True):
        want = expected[: len(row)] if kind == "token_logits" else expected
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_a_kind_the_graph_cannot_give_is_an_error(fixture_dir: Any) -> None:
    model = _load(fixture_dir("bert-embedding"))
    with pytest.raises(ValueError, match="cannot give output 'logits'"):
        _encode(model, [[5, 6, 7]], ["logits"])
    assert _encode(model, [], []) == []


def test_tokens_that_are_not_keys_are_refused_not_ignored(fixture_dir: Any) -> None:
    """A graph reads its own attention mask; a row whose last tokens are not keys (ColBERT's
    query expansion) cannot be said to it, so the engine refuses rather than answer as if all were."""
    model = _load(fixture_dir("bert-embedding"))
    masked = Batch.from_items([WorkItem(token_ids=[5, 6, 7, 8], output="hidden", key_tokens=2)])
    with pytest.raises(ValueError, match="not attention keys"):
        model.encode(masked)
    every = Batch.from_items([WorkItem(token_ids=[5, 6, 7, 8], output="hidden", key_tokens=4)])
    np.testing.assert_array_equal(model.encode(every)[0], _encode(model, [[5, 6, 7, 8]], ["hidden"])[0])


def test_one_session_serves_many_threads(fixture_dir: Any) -> None:
    path = fixture_dir("bert-token")
    model = _load(path)
    rows = _rows(_vocab(path))
    kinds = ["token_logits"] * len(rows)
    expected = _encode(model, rows, kinds)
    failures: list[str] = []

    def worker() -> None:
        for _ in range(5):
            for got, want in zip(_encode(model, rows, kinds), expected, strict=True):
                if not np.array_equal(got, want):
                    failures.append("mismatch")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_matches_native_engine(fixture_dir: Any) -> None:
    try:
        from vllm_srun.engines.native import NativeEngine
    except ImportError as exc:
        pytest.skip(f"the native engine is not importable: {exc}")
    path = fixture_dir("modernbert-token")
    spec = _spec(path)
    native_engine = NativeEngine()
    native = native_engine.load(spec, CPU, "float32", native_engine.read(spec, "float32"))
    ours = _load(path)
    rows = _rows(_vocab(path))
    for got, want in zip(
        _encode(ours, rows, ["token_logits"] * 6), _encode(native, rows, ["token_logits"] * 6), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


# supports / load refusals ---------------------------------------------------------------------


def test_supports_names_the_reason(fixture_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = OnnxRuntimeEngine()
    spec = _spec(fixture_dir("bert-sequence"))
    assert engine.supports(spec, CPU) is None
    no_graph = ModelSpec(family="task_heads", architecture="BertModel", config={})
    assert "no ONNX graph" in (engine.supports(no_graph, CPU) or "")
    assert "cpu only" in (engine.supports(spec, Device("cuda", 0)) or "")
    assert engine.auto_priority is None and engine.dtypes == ("float32",)
    with pytest.raises(ConfigError, match="bfloat16"):
        engine.read(spec, "bfloat16")
    import vllm_srun.engines.onnxruntime.engine as module

    monkeypatch.setattr(module, "_available", lambda: False)
    assert engine.supports(spec, CPU) == "onnxruntime is not installed (pip install 'vllm-srun[onnx]')"


def test_module_imports_without_onnxruntime() -> None:
    code = """
import sys
sys.modules["onnxruntime"] = None
from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine
from vllm_srun.plugins.base import Device, ModelSpec
spec = ModelSpec(family="task_heads", architecture="BertModel", config={}, extra={"onnx": "/x.onnx"})
print(OnnxRuntimeEngine().supports(spec, Device("cpu")))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "onnxruntime is not installed" in result.stdout


def _graph(domain: str = "", op: str = "Identity", input_name: str = "input_ids") -> Any:
    from onnx import TensorProto, helper

    node = helper.make_node(op, [input_name], ["last_hidden_state"], domain=domain)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["b", "t", 4])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["b", "t", 4])],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def test_custom_operators_are_refused(tmp_path: Path, fixture_dir: Any) -> None:
    path = tmp_path / "custom.onnx"
    onnx.save_model(_graph("com.example.custom", "Backdoor"), str(path))
    spec = _spec(fixture_dir("bert-embedding"), path)
    with pytest.raises(ConfigError, match=r"custom operators \['com.example.custom:Backdoor'\]"):
        OnnxRuntimeEngine().read(spec, "float32")
    # Standard and contrib domains pass the check.
    onnx.save_model(_graph("com.microsoft", "FastGelu"), str(path))
    OnnxRuntimeEngine().read(spec, "float32")


def test_external_data_is_refused(tmp_path: Path, fixture_dir: Any) -> None:
    src = fixture_dir("bert-embedding") / "onnx" / "model.onnx"
    model = onnx.load(str(src))
    dst = tmp_path / "split" / "model.onnx"
    dst.parent.mkdir()
    onnx.save_model(
        model,
        str(dst),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx_data",
        size_threshold=0,
    )
    with pytest.raises(ConfigError, match="external data"):
        OnnxRuntimeEngine().read(_spec(fixture_dir("bert-embedding"), dst), "float32")


def test_external_data_in_a_constant_is_refused(tmp_path: Path, fixture_dir: Any) -> None:
    """A Constant's value pointing at a file next to the server would be read and answered."""
    from onnx import TensorProto, helper

    secret = TensorProto(name="secret", data_type=TensorProto.FLOAT, dims=[32])
    secret.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "secret.txt"), ("length", "128")):
        entry = secret.external_data.add()
        entry.key, entry.value = key, value
    model = _graph()
    model.graph.node.append(helper.make_node("Constant", [], ["leak"], value=secret))
    path = tmp_path / "leak.onnx"
    onnx.save_model(model, str(path))
    with pytest.raises(ConfigError, match=r"external data.*'secret'"):
        OnnxRuntimeEngine().read(_spec(fixture_dir("bert-embedding"), path), "float32")
    # Inside a subgraph too.
    inner = helper.make_graph([helper.make_node("Constant", [], ["c"], value=secret)], "inner", [], [])
    model = _graph()
    model.graph.node.append(helper.make_node("Loop", ["", ""], ["o"], body=inner))
    onnx.save_model(model, str(path))
    with pytest.raises(ConfigError, match="external data"):
        OnnxRuntimeEngine().read(_spec(fixture_dir("bert-embedding"), path), "float32")


def test_a_file_that_is_not_onnx_names_itself(tmp_path: Path, fixture_dir: Any) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ConfigError, match=r"garbage\.onnx: not an ONNX graph"):
        OnnxRuntimeEngine().read(_spec(fixture_dir("bert-embedding"), path), "float32")


def test_unknown_graph_inputs_are_refused(tmp_path: Path, fixture_dir: Any) -> None:
    path = tmp_path / "pixels.onnx"
    onnx.save_model(_graph(input_name="pixel_values"), str(path))
    engine = OnnxRuntimeEngine()
    spec = _spec(fixture_dir("bert-embedding"), path)
    with pytest.raises(ConfigError, match="pixel_values"):
        engine.load(spec, CPU, "float32", engine.read(spec, "float32"))

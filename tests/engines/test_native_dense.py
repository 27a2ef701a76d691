"""The native engine's small-batch paths (dense on torch, dense on onnxruntime): the same
numbers as the packed path and the references (Transformers at 1e-4 on tiny fixtures;
sentence-transformers on MiniLM, cosine >= 0.99999), and the choice between the paths by batch
shape. float32's linears run on oneDNN where the CPU has it, packed after the export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers import minilm_dir  # noqa: E402

from vllm_srun.engines.native import packed as packed_linears  # noqa: E402
from vllm_srun.engines.native.engine import DENSE_MAX_ROWS, NativeModel  # noqa: E402
from vllm_srun.plugins.base import Batch, WorkItem  # noqa: E402
from vllm_srun.testing.task_heads_fixtures import write_fixture  # noqa: E402

VOCAB = 100
# One row alone, rows of equal length (no mask), rows of unequal length (a padded block).
SHAPES = {"one": (17,), "equal": (9, 9, 9), "unequal": (5, 23, 1, 12)}


def run(
    native: NativeModel,
    rows: list[list[int]],
    kind: str,
    *,
    path: str | None,
    types: list[list[int]] | None = None,
) -> list[np.ndarray]:
    items = [
        WorkItem(token_ids=r, output=kind, type_ids=None if types is None else types[i])
        for i, r in enumerate(rows)
    ]
    return native.encode(Batch.from_items(items), path=path)


def tiny_bert(cls: Any, **overrides: Any) -> Any:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="eager",
        **overrides,
    )
    return cls(config)


SMALL = ("dense", "onnx")


@pytest.mark.parametrize("small", SMALL)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("with_types", [False, True])
def test_small_batch_paths_match_transformers(
    nt: Any, tmp_path: Path, small: str, shape: str, with_types: bool
) -> None:
    hf = nt.randomize(tiny_bert(transformers.BertModel))
    native = nt.load_native(nt.save(hf, tmp_path))
    assert native.paths == ("packed", "dense", "onnx")
    rows = nt.token_rows(VOCAB, SHAPES[shape])
    rng = np.random.default_rng(3)
    types = [rng.integers(0, 2, size=len(r)).tolist() for r in rows] if with_types else None
    ref = nt.reference(hf, rows, types).last_hidden_state
    for kind in ("hidden", "mean", "cls", "last"):
        dense = run(native, rows, kind, path=small, types=types)
        packed = run(native, rows, kind, path="packed", types=types)
        for i, row in enumerate(rows):
            n = len(row)
            expected = {
                "hidden": ref[i, :n],
                "mean": ref[i, :n].mean(0),
                "cls": ref[i, 0],
                "last": ref[i, n - 1],
            }[kind]
            nt.assert_close(dense[i], expected)
            np.testing.assert_allclose(dense[i], packed[i], atol=1e-5, rtol=0)


@pytest.mark.parametrize("small", SMALL)
@pytest.mark.parametrize("variant", ["bert-embedding", "bert-reranker", "bert-sequence", "bert-token"])
def test_small_batch_paths_on_the_fixtures_match_transformers(
    nt: Any, tmp_path: Path, variant: str, small: str
) -> None:
    path = write_fixture(tmp_path / variant, variant=variant)
    hf_cls = {
        "bert-embedding": transformers.AutoModel,
        "bert-token": transformers.AutoModelForTokenClassification,
    }.get(variant, transformers.AutoModelForSequenceClassification)
    hf = hf_cls.from_pretrained(path, attn_implementation="eager").eval()
    native = nt.load_native(path)
    for lengths in SHAPES.values():
        rows = nt.token_rows(int(hf.config.vocab_size), lengths, seed=len(lengths))
        out = nt.reference(hf, rows)
        got = run(native, rows, "default", path=small)
        for i, row in enumerate(rows):
            n = len(row)
            if variant == "bert-embedding":
                expected = out.last_hidden_state[i, :n].mean(0)
            elif variant == "bert-token":
                expected = out.logits[i, :n]
            else:
                expected = out.logits[i]
            nt.assert_close(got[i], expected)


def test_the_engine_chooses_a_small_batch_path_for_small_even_batches_only(nt: Any, tmp_path: Path) -> None:
    native = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path))
    assert native.dense_rows(np.array([40]))
    assert native.dense_rows(np.array([30, 32, 31]))
    assert not native.dense_rows(np.array([5, 40]))  # mostly padding: packed costs less
    assert not native.dense_rows(np.array([20] * (DENSE_MAX_ROWS + 1)))
    assert not native.dense_rows(np.array([], dtype=np.int64))
    assert native.choose_path(np.array([40])) == "onnx"
    assert native.choose_path(np.array([5, 40])) == "packed"
    # Whichever path the engine picks, the rows are the rows of the other path.
    rows = nt.token_rows(VOCAB, (5, 40, 7, 33, 1, 12, 19, 2, 8))
    for batch in (rows[:1], rows[:2], rows):
        chosen = run(native, batch, "mean", path=None)
        for forced in ("packed", "dense", "onnx"):
            for a, b in zip(chosen, run(native, batch, "mean", path=forced), strict=True):
                np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_without_onnx_small_batches_stay_on_torch(
    nt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(NativeModel, "small_batch_onnx", False)
    native = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path))
    assert native.paths == ("packed", "dense")
    assert native.choose_path(np.array([12])) == "dense"
    with pytest.raises(ValueError, match="runs: packed, dense"):
        run(native, [[5, 6, 7]], "mean", path="onnx")


def test_bfloat16_small_batches_stay_on_torch_close_to_packed(nt: Any, tmp_path: Path) -> None:
    hf = nt.randomize(tiny_bert(transformers.BertModel))
    native = nt.load_native(nt.save(hf, tmp_path), "bfloat16")
    assert native.paths == ("packed", "dense")
    rows = nt.token_rows(VOCAB, SHAPES["unequal"])
    ref = nt.reference(hf, rows).last_hidden_state
    for i, (dense, packed) in enumerate(
        zip(run(native, rows, "mean", path="dense"), run(native, rows, "mean", path="packed"), strict=True)
    ):
        np.testing.assert_allclose(dense, packed, atol=0.05, rtol=0)
        np.testing.assert_allclose(dense, ref[i, : len(rows[i])].mean(0).numpy(), atol=0.15, rtol=0.05)


def test_int8_runs_packed_only(nt: Any, tmp_path: Path) -> None:
    native = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path / "b"), "int8")
    assert native.paths == ("packed",)
    rows = nt.token_rows(50, (6,))
    with pytest.raises(ValueError, match="runs: packed"):
        run(native, rows, "cls", path="dense")


def test_modernbert_small_batches_run_dense_with_its_window(nt: Any, tmp_path: Path) -> None:
    """Every architecture has the small-batch path (its table row declares dense only for
    ModernBERT: its sliding window and rotary tables are traced at a fixed width)."""
    modern = nt.load_native(write_fixture(tmp_path / "m", variant="modernbert-embedding"))
    assert modern.paths == ("packed", "dense")
    rows = nt.token_rows(50, (20, 17))  # longer than the fixture's window of 8
    for dense, packed in zip(
        run(modern, rows, "hidden", path="dense"), run(modern, rows, "hidden", path="packed"), strict=True
    ):
        np.testing.assert_allclose(dense, packed, atol=1e-5, rtol=0)


@pytest.mark.parametrize("small", SMALL)
def test_minilm_small_batch_paths_match_sentence_transformers(nt: Any, small: str) -> None:
    st = pytest.importorskip("sentence_transformers")
    from tokenizers import Tokenizer

    from vllm_srun.registry.corpus import corpus

    path = minilm_dir()
    assert json.loads((path / "config.json").read_text())["architectures"] == ["BertModel"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    texts = [t for t in corpus(40, seed=11) if len(tokenizer.encode(t).ids) <= 128][:12]
    reference = st.SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)
    native = nt.load_native(path)
    rows = [tokenizer.encode(t).ids for t in texts]
    got = [v for i in range(0, len(rows), 3) for v in run(native, rows[i : i + 3], "mean", path=small)]
    got += [run(native, [row], "mean", path=small)[0] for row in rows]
    for vector, expected in zip(got, [*reference, *reference], strict=True):
        cosine = float(vector @ expected / np.linalg.norm(vector) / np.linalg.norm(expected))
        assert cosine >= 0.99999, cosine


def test_the_onnx_session_is_built_and_probed_on_the_forward_threads_count(
    nt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With an intra-op thread count configured, the loading thread's torch count is not the
    # forward thread's: the session must be opened (and probed) on the configured count at
    # load, and be the one every forward uses, whichever thread runs it.
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    from vllm_srun.app.loading import Executors
    from vllm_srun.engines.native.onnx_path import OnnxSmallBatch
    from vllm_srun.tuning import set_forward_threads, start_forward_thread

    wanted = 1 if torch.get_num_threads() != 1 else 2
    used: list[tuple[str, int]] = []
    phase = ["load"]
    real_hidden = OnnxSmallBatch.hidden

    def hidden(self: OnnxSmallBatch, *args: Any) -> np.ndarray:
        used.append((phase[0], id(self.session)))
        return real_hidden(self, *args)

    monkeypatch.setattr(OnnxSmallBatch, "hidden", hidden)
    Executors(intra_op_threads=wanted)  # as the server's: the forward executors' count
    try:
        native = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path))
        session = native._onnx
        assert session is not None
        assert session.session.get_session_options().intra_op_num_threads == wanted
        probed = {sid for p, sid in used if p == "load"}
        assert len(probed) == 1  # the probe ran on the session just opened
        rows = nt.token_rows(VOCAB, (11,))
        phase[0] = "forward"
        with ThreadPoolExecutor(1, initializer=partial(start_forward_thread, wanted)) as forward:
            for _ in range(2):
                forward.submit(run, native, rows, "mean", path="onnx").result()
        # Another thread (the golden check's) with torch's own count uses the same session.
        run(native, rows, "mean", path="onnx")
    finally:
        set_forward_threads(None)
    assert {sid for p, sid in used if p == "forward"} == probed
    assert native._onnx is session and id(session.session) in probed


def test_the_engine_reports_the_paths_it_chooses_and_their_memory(
    nt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path / "a"))
    described = native.describe()
    assert described["engine_paths"] == ["native", "onnxruntime-small-batch"]
    assert described["memory_bytes"]["native"] == 0
    assert described["memory_bytes"]["onnxruntime-small-batch"] >= 0
    monkeypatch.setattr(NativeModel, "small_batch_onnx", False)
    torch_only = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path / "b"))
    assert torch_only.describe() == {
        "engine_paths": ["native", "native-small-batch"],
        "memory_bytes": {"native": 0, "native-small-batch": 0},
    }
    int8 = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path / "c"), "int8")
    assert int8.describe()["engine_paths"] == ["native"]


def test_the_onnx_path_adds_at_most_one_copy_of_minilm_weights(nt: Any) -> None:
    path = minilm_dir()
    native = nt.load_native(path)
    tensors = [*native.module.parameters(), *native.module.buffers()]  # packed linears are buffers
    weights = sum(t.numel() * t.element_size() for t in tensors)
    added = native.describe()["memory_bytes"]["onnxruntime-small-batch"]
    assert 0 < added <= 1.25 * weights, (added, weights)


def test_the_onnx_pool_threads_run_at_the_forward_priority(
    nt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from vllm_srun import defaults
    from vllm_srun.engines.native.onnx_path import OnnxSmallBatch

    monkeypatch.delenv("VLLM_SRUN_FORWARD_NICE", raising=False)
    native = nt.load_native(nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path))
    before = set(os.listdir("/proc/self/task"))
    session = OnnxSmallBatch(native.module, 3)  # two pool threads beside the caller's
    started = set(os.listdir("/proc/self/task")) - before
    assert len(started) >= 2, started
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in started} == {
        min(19, base + defaults.FORWARD_NICE)
    }
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == base  # the caller's own is unchanged
    del session


def test_load_runs_a_lone_row_of_every_token_count_on_the_torch_paths(
    nt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new shape's first forward builds its oneDNN primitives in bfloat16 and int8: at load,
    not on a lone caller's request. float32 builds nothing per shape: none is run there."""
    from vllm_srun.engines.native.engine import WARM_MAX_TOKENS

    monkeypatch.setattr(NativeModel, "warm_max_tokens", WARM_MAX_TOKENS)  # tests/conftest.py shortens it
    lone: list[tuple[str, int]] = []
    encode = NativeModel.encode

    def recording(self: NativeModel, batch: Batch, *, path: str | None = None) -> list[np.ndarray]:
        if path is None and len(batch) == 1:
            lone.append((self.dtype, int(batch.offsets[-1])))
        return encode(self, batch, path=path)

    monkeypatch.setattr(NativeModel, "encode", recording)
    saved = nt.save(nt.randomize(tiny_bert(transformers.BertModel)), tmp_path)
    nt.load_native(saved, "bfloat16")
    assert lone == [("bfloat16", n) for n in range(1, 63)]  # 64 positions, two short (RoBERTa's offset)
    lone.clear()
    nt.load_native(saved, "int8")
    assert [n for _, n in lone] == list(range(1, 63))
    lone.clear()
    nt.load_native(saved)
    assert lone == []


@pytest.mark.skipif(not packed_linears.available(), reason="no oneDNN linear on this torch and CPU")
def test_float32_on_onednn_keeps_onnxruntime_for_small_batches_and_warms_torchs_lone_rows(
    nt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32's encoder linears on oneDNN, packed after the small-batch graph was traced from
    the plain ones: every path within 1e-4 of Transformers and 1e-5 of each other. Lone rows
    run at load only where they run on torch (oneDNN builds a primitive per token count)."""
    from vllm_srun.engines.native.engine import WARM_MAX_TOKENS

    monkeypatch.setattr(NativeModel, "warm_max_tokens", WARM_MAX_TOKENS)
    lone: list[int] = []
    encode = NativeModel.encode

    def recording(self: NativeModel, batch: Batch, *, path: str | None = None) -> list[np.ndarray]:
        if path is None and len(batch) == 1:
            lone.append(int(batch.offsets[-1]))
        return encode(self, batch, path=path)

    monkeypatch.setattr(NativeModel, "encode", recording)
    hf = nt.randomize(tiny_bert(transformers.BertModel))
    saved = nt.save(hf, tmp_path)
    native = nt.load_native(saved)
    assert native.packed_linears and native.paths == ("packed", "dense", "onnx")
    assert any(isinstance(m, packed_linears.PackedLinear) for m in native.module.modules())
    assert lone == []  # lone rows run on onnxruntime: nothing of oneDNN's to build
    for lengths in SHAPES.values():
        rows = nt.token_rows(VOCAB, lengths)
        ref = nt.reference(hf, rows).last_hidden_state
        outs = {path: run(native, rows, "hidden", path=path) for path in native.paths}
        for i, row in enumerate(rows):
            for path in native.paths:
                nt.assert_close(outs[path][i], ref[i, : len(row)])
                np.testing.assert_allclose(outs[path][i], outs["packed"][i], atol=1e-5, rtol=0)
    monkeypatch.setattr(NativeModel, "small_batch_onnx", False)
    torch_only = nt.load_native(saved)
    assert torch_only.packed_linears and torch_only.paths == ("packed", "dense")
    assert lone == list(range(1, 63))

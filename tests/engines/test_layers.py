"""Early exits on the native engine: a row asking for `"<kind>@<layer>"` gets Transformers'
`hidden_states[layer]` (pooled as asked), within 1e-5, on BERT and ModernBERT."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vllm_srun.plugins.base import Batch, WorkItem  # noqa: E402

VOCAB = 100
ATOL = 1e-5
LAYERS = 4


def bert(**overrides: Any) -> Any:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return getattr(transformers, overrides.get("cls", "BertModel"))(config).eval()


def modernbert(**overrides: Any) -> Any:
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        local_attention=8,  # shorter than most rows: the sliding layers' windows matter
        global_attn_every_n_layers=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        attn_implementation="eager",
    )
    return getattr(transformers, overrides.get("cls", "ModernBertModel"))(config).eval()


BUILDERS = {"bert": bert, "modernbert": modernbert}


@pytest.fixture(params=sorted(BUILDERS))
def pair(request: Any, nt: Any, tmp_path: Path) -> tuple[Any, Any]:
    """(the Transformers model, the same weights on the native engine)."""
    torch.manual_seed(0)
    hf = BUILDERS[request.param]()
    return hf, nt.load_native(nt.save(hf, tmp_path))


@pytest.mark.parametrize("layer", range(1, LAYERS + 1))
def test_each_layer_matches_transformers_hidden_states(nt: Any, pair: tuple[Any, Any], layer: int) -> None:
    hf, native = pair
    rows = nt.token_rows(VOCAB)
    with torch.no_grad():
        ids, mask = nt.padded(rows)
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[layer]
    hidden = nt.encode(native, rows, f"hidden@{layer}")
    means = nt.encode(native, rows, f"mean@{layer}")
    cls = nt.encode(native, rows, f"cls@{layer}")
    last = nt.encode(native, rows, f"last@{layer}")
    for i, row in enumerate(rows):
        n = len(row)
        nt.assert_close(hidden[i], ref[i, :n], atol=ATOL)
        nt.assert_close(means[i], ref[i, :n].mean(0), atol=ATOL)
        nt.assert_close(cls[i], ref[i, 0], atol=ATOL)
        nt.assert_close(last[i], ref[i, n - 1], atol=ATOL)


def test_last_layer_named_is_the_default_output(nt: Any, pair: tuple[Any, Any]) -> None:
    _, native = pair
    rows = nt.token_rows(VOCAB)
    for kind in ("mean", "hidden", "cls"):
        named = nt.encode(native, rows, f"{kind}@{LAYERS}")
        plain = nt.encode(native, rows, kind)
        for a, b in zip(named, plain, strict=True):
            np.testing.assert_array_equal(a, b)


def test_mixed_exits_in_one_batch_equal_solo_runs(nt: Any, pair: tuple[Any, Any]) -> None:
    _, native = pair
    rows = nt.token_rows(VOCAB)
    kinds = ["mean@1", "hidden", "cls@3", "mean", "last@2", "hidden@1"]
    nt.assert_rows_match_solo(native, rows, kinds)


def test_exit_layers_and_refusals(nt: Any, pair: tuple[Any, Any], tmp_path: Path) -> None:
    _, native = pair
    assert native.exit_layers == tuple(range(1, LAYERS + 1))
    rows = nt.token_rows(VOCAB)[:1]
    for output in (f"mean@{LAYERS + 1}", "mean@0", "mean@x", "logits@1"):
        with pytest.raises(ValueError, match="output"):
            nt.encode(native, rows, output)
    batch = Batch.from_items([WorkItem(token_ids=rows[0], output="mean@1")])
    for path in native.paths[1:]:  # the small-batch paths run every layer
        with pytest.raises(ValueError, match="packed path"):
            native.encode(batch, path=path)


def test_small_batch_with_an_exit_takes_the_packed_path(nt: Any, tmp_path: Path) -> None:
    """A one-row batch would take a small-batch path (onnxruntime where installed), which runs
    every layer; the exit must still come from its own layer."""
    torch.manual_seed(0)
    hf = bert()
    native = nt.load_native(nt.save(hf, tmp_path))
    assert len(native.paths) > 1
    row = nt.token_rows(VOCAB, lengths=(7,))[0]
    assert native.choose_path(np.array([len(row)])) != "packed"
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([row]), output_hidden_states=True).hidden_states[2]
    (got,) = native.encode(Batch.from_items([WorkItem(token_ids=row, output="mean@2")]))
    nt.assert_close(got, ref[0].mean(0), atol=ATOL)


def test_classifier_rows_and_exit_rows_share_a_batch(nt: Any, tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = bert(cls="BertForSequenceClassification")
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)[:3]
    got = nt.encode(native, rows, ["logits", "mean@1", "logits"])
    with torch.no_grad():
        ids, mask = nt.padded(rows)
        out = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    nt.assert_close(got[0], out.logits[0], atol=ATOL)
    nt.assert_close(got[2], out.logits[2], atol=ATOL)
    nt.assert_close(got[1], out.hidden_states[1][1, : len(rows[1])].mean(0), atol=ATOL)


def test_onnxruntime_engine_names_an_exit_it_cannot_run(tmp_path: Path) -> None:
    """A replica plans for native workers; a worker on onnxruntime refuses the exit by name."""
    pytest.importorskip("onnxruntime")
    from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine
    from vllm_srun.families.task_heads import TaskHeadsFamily
    from vllm_srun.plugins.base import Device
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    path = write_fixture(tmp_path / "m", variant="bert-embedding", onnx=True)
    spec = TaskHeadsFamily().describe(ModelPackage(path))
    engine = OnnxRuntimeEngine()
    model = engine.load(spec, Device("cpu"), "float32", engine.read(spec, "float32"))
    batch = Batch.from_items([WorkItem(token_ids=[2, 10, 11, 1], output="mean@1")])
    with pytest.raises(ValueError, match="cannot exit at an earlier layer"):
        model.encode(batch)

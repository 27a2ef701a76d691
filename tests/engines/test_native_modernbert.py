"""ModernBERT on the native engine: parity with Transformers (atol 1e-4) across heads and configs.

Rows of 1-40 tokens against a local window of 8 (+-4 tokens) exercise both the sliding-window
and the global layers; distinct global/local rope thetas catch a swapped rotary table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vllm_srun.errors import PackageError  # noqa: E402

VOCAB = 100


def modernbert_config(**overrides: Any) -> Any:
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        local_attention=8,
        global_attn_every_n_layers=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        global_rope_theta=1000.0,
        local_rope_theta=50.0,
        attn_implementation="eager",
    )
    return transformers.ModernBertConfig(**(settings | overrides))


BIASES = {"norm_bias": True, "attention_bias": True, "mlp_bias": True, "classifier_bias": True}


@pytest.mark.parametrize("overrides", [{}, BIASES], ids=["no_bias", "biases"])
def test_modernbert_model_matches_transformers(nt: Any, tmp_path: Path, overrides: dict[str, Any]) -> None:
    hf = nt.randomize(transformers.ModernBertModel(modernbert_config(**overrides)))
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).last_hidden_state
    hidden = nt.encode(native, rows, "hidden")
    means = nt.encode(native, rows, "default")
    for i, row in enumerate(rows):
        nt.assert_close(hidden[i], ref[i, : len(row)])
        nt.assert_close(means[i], ref[i, : len(row)].mean(0))


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_labels": 3},
        {"num_labels": 3, "classifier_pooling": "mean", **BIASES},
        {"num_labels": 5, "problem_type": "multi_label_classification", "classifier_activation": "silu"},
    ],
    ids=["cls", "mean_biases", "multi_label"],
)
def test_modernbert_sequence_classification(nt: Any, tmp_path: Path, overrides: dict[str, Any]) -> None:
    hf = nt.randomize(transformers.ModernBertForSequenceClassification(modernbert_config(**overrides)))
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).logits
    for kind in ("logits", "default"):
        for i, got in enumerate(nt.encode(native, rows, kind)):
            nt.assert_close(got, ref[i])


@pytest.mark.parametrize("overrides", [{}, BIASES], ids=["no_bias", "biases"])
def test_modernbert_token_classification(nt: Any, tmp_path: Path, overrides: dict[str, Any]) -> None:
    hf = nt.randomize(
        transformers.ModernBertForTokenClassification(modernbert_config(num_labels=4, **overrides))
    )
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).logits
    for i, got in enumerate(nt.encode(native, rows, "token_logits")):
        nt.assert_close(got, ref[i, : len(rows[i])])


def test_legacy_config_keys(nt: Any, tmp_path: Path) -> None:
    """Hub configs written before transformers 5: an interval and two thetas, no layer_types."""
    hf = nt.randomize(
        transformers.ModernBertForSequenceClassification(modernbert_config(num_hidden_layers=5))
    )
    path = nt.save(hf, tmp_path)
    config = json.loads((path / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        del config[key]
    config |= {"global_attn_every_n_layers": 2, "global_rope_theta": 1000.0, "local_rope_theta": 50.0}
    (path / "config.json").write_text(json.dumps(config))
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).logits
    for i, got in enumerate(nt.encode(nt.load_native(path), rows, "logits")):
        nt.assert_close(got, ref[i])


def test_mixed_batch_rows_equal_solo_runs(nt: Any, tmp_path: Path) -> None:
    hf = nt.randomize(transformers.ModernBertForTokenClassification(modernbert_config(num_labels=3)))
    native = nt.load_native(nt.save(hf, tmp_path))
    kinds = ["token_logits", "hidden", "mean", "cls", "last", "default"]
    nt.assert_rows_match_solo(native, nt.token_rows(VOCAB), kinds)


def test_missing_and_unexpected_tensors(nt: Any, tmp_path: Path) -> None:
    from vllm_srun.engines.native import NativeEngine
    from vllm_srun.plugins.base import Device

    path = nt.save(
        nt.randomize(transformers.ModernBertForSequenceClassification(modernbert_config())), tmp_path
    )
    engine, spec = NativeEngine(), nt.spec_from_dir(path)
    host = engine.read(spec, "float32")
    missing = dict(host)
    del missing["model.layers.2.attn_norm.weight"]
    with pytest.raises(PackageError, match=r"model\.layers\.2\.attn_norm\.weight"):
        engine.load(spec, Device("cpu"), "float32", missing)
    # Layer 0 has no attn_norm: a checkpoint that has one does not match this architecture.
    extra = host | {"model.layers.0.attn_norm.weight": torch.ones(32)}
    with pytest.raises(PackageError, match=r"unexpected tensor 'model\.layers\.0\.attn_norm\.weight'"):
        engine.load(spec, Device("cpu"), "float32", extra)


def test_output_needing_a_missing_head_is_refused(nt: Any, tmp_path: Path) -> None:
    native = nt.load_native(
        nt.save(nt.randomize(transformers.ModernBertModel(modernbert_config())), tmp_path)
    )
    with pytest.raises(ValueError, match="logits"):
        nt.encode(native, [[5, 6, 7]], "logits")
    with pytest.raises(ValueError, match="unknown output"):
        nt.encode(native, [[5, 6, 7]], "pooler")


def test_many_rows_split_into_several_attention_groups(nt: Any, tmp_path: Path) -> None:
    """Rows of 1-120 tokens: attention runs on several padded groups; results still match."""
    import numpy as np

    from vllm_srun.engines.native.attention import Segments

    hf = nt.randomize(transformers.ModernBertForTokenClassification(modernbert_config(num_labels=3)))
    native = nt.load_native(nt.save(hf, tmp_path))
    rows = nt.token_rows(VOCAB, lengths=[3, 100, 7, 64, 1, 90, 33, 12, 120, 5, 77, 48] * 3)
    offsets = np.cumsum([0] + [len(r) for r in rows])
    assert len(Segments.from_offsets(offsets, torch.device("cpu")).groups()[0]) > 1
    ref = nt.reference(hf, rows).logits
    for i, got in enumerate(nt.encode(native, rows, "token_logits")):
        nt.assert_close(got, ref[i, : len(rows[i])])


def test_bfloat16_mean_pooled_classifier(nt: Any, tmp_path: Path) -> None:
    import numpy as np

    config = modernbert_config(num_labels=3, classifier_pooling="mean")
    hf = nt.randomize(transformers.ModernBertForSequenceClassification(config))
    native = nt.load_native(nt.save(hf, tmp_path), dtype="bfloat16")
    rows = nt.token_rows(VOCAB)
    ref = nt.reference(hf, rows).logits
    for i, got in enumerate(nt.encode(native, rows, "logits")):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, ref[i].numpy(), atol=0.2, rtol=0.05)

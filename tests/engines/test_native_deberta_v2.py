"""DeBERTa-v2 settings beyond the table's two fixture flavours, against Transformers (1e-4 on
hidden states, float32, every parameter redrawn): one relative term alone, a pos_att_type
string, max_relative_positions -1 (the position table's size), relative attention off (plain
attention at the disentangled scale); *ForMaskedLM packages with either LM head load as the
bare encoder; what is not implemented is refused naming the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vllm_srun.errors import ConfigError  # noqa: E402

BASE = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "type_vocab_size": 0,
    "relative_attention": True,
    "position_biased_input": False,
}
SETTINGS = {
    "c2p-only-buckets": {"pos_att_type": ["c2p"], "position_buckets": 6, "share_att_key": True},
    "p2c-only-separate": {"pos_att_type": ["p2c"], "max_relative_positions": 12},
    "string-terms-full-table": {
        "pos_att_type": "p2c|c2p",
        "position_buckets": 16,
        "max_relative_positions": -1,
    },
    "no-relative-attention": {
        "relative_attention": False,
        "position_biased_input": True,
        "pos_att_type": ["c2p", "p2c"],
    },
}


def _saved(model: Any, tmp_path: Path, nt: Any) -> Any:
    return nt.load_native(nt.save(nt.randomize(model, seed=5), tmp_path / "m"))


@pytest.mark.parametrize("name", SETTINGS)
def test_settings_match_transformers(name: str, tmp_path: Path, nt: Any) -> None:
    config = transformers.DebertaV2Config(**{**BASE, **SETTINGS[name]})
    config._attn_implementation = "eager"
    hf = transformers.DebertaV2Model(config)
    native = _saved(hf, tmp_path, nt)
    rows = nt.token_rows(BASE["vocab_size"], lengths=(3, 37, 1, 20))
    want = nt.reference(hf, rows).last_hidden_state
    for i, got in enumerate(nt.encode(native, rows, "hidden")):
        nt.assert_close(got, want[i, : len(rows[i])])
    nt.assert_rows_match_solo(native, rows, ["hidden"] * len(rows))


@pytest.mark.parametrize("legacy", [True, False])
def test_masked_lm_packages_serve_the_encoder(legacy: bool, tmp_path: Path, nt: Any) -> None:
    config = transformers.DebertaV2Config(
        **BASE, pos_att_type=["p2c", "c2p"], position_buckets=8, legacy=legacy
    )
    config._attn_implementation = "eager"
    hf = transformers.DebertaV2ForMaskedLM(config)
    native = _saved(hf, tmp_path, nt)
    assert native.paths[0] == "packed"
    rows = nt.token_rows(BASE["vocab_size"], lengths=(9, 30))
    want = nt.reference(hf.deberta, rows).last_hidden_state
    for i, got in enumerate(nt.encode(native, rows, "hidden")):
        nt.assert_close(got, want[i, : len(rows[i])])


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"conv_kernel_size": 3}, "conv_kernel_size"),
        ({"pos_att_type": ["c2p", "p2p"]}, "pos_att_type"),
        ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd"),
    ],
)
def test_what_is_not_implemented_is_refused(extra: dict[str, Any], named: str) -> None:
    from vllm_srun.engines.native.deberta_v2 import DebertaV2

    with pytest.raises(ConfigError, match=named):
        DebertaV2({**BASE, **extra})


def test_a_position_table_the_model_does_not_use_is_skipped(tmp_path: Path, nt: Any) -> None:
    """Checkpoints without absolute positions may still carry the table (the reference skips
    it on load too); any other stray tensor is still an error."""
    from safetensors.torch import load_file, save_file

    from vllm_srun.errors import PackageError

    config = transformers.DebertaV2Config(**BASE, pos_att_type=["c2p", "p2c"], position_buckets=8)
    config._attn_implementation = "eager"
    hf = nt.randomize(transformers.DebertaV2Model(config), seed=5)
    path = nt.save(hf, tmp_path / "m")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["embeddings.position_embeddings.weight"] = torch.zeros(BASE["max_position_embeddings"], 32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    rows = nt.token_rows(BASE["vocab_size"], lengths=(7, 19))
    want = nt.reference(hf, rows).last_hidden_state
    for i, got in enumerate(nt.encode(nt.load_native(path), rows, "hidden")):
        nt.assert_close(got, want[i, : len(rows[i])])
    tensors["embeddings.stray.weight"] = torch.zeros(2)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PackageError, match="stray"):
        nt.load_native(path)

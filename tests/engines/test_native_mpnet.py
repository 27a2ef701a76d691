"""MPNet on the native engine, where the table-driven parity test does not reach: tokens with
id 1 (Transformers' fixed padding index) inside rows, rows up to the whole position table (every
relative-position bucket, past the 128 max distance), and the buckets themselves. Tolerance as
test_parity's: 1e-4 against Transformers on right-padded batches, float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vllm_srun.engines.native.mpnet import relative_buckets  # noqa: E402
from vllm_srun.errors import ConfigError  # noqa: E402

VOCAB = 100
POSITIONS = 160  # rows of up to 158 tokens: distances past MAX_DISTANCE (128)


def mpnet_config(**overrides: Any) -> Any:
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=POSITIONS,
        pad_token_id=1,
        attn_implementation="eager",
    )
    return transformers.MPNetConfig(**(settings | overrides))


def rows_with_padding_ids() -> list[list[int]]:
    rng = np.random.default_rng(4)
    rows = [rng.integers(2, VOCAB, size=n).tolist() for n in (1, 7, 40, POSITIONS - 2, 131)]
    for row in rows[1:]:
        for at in rng.choice(len(row), size=max(1, len(row) // 10), replace=False):
            row[int(at)] = 1  # the padding index as a token: it does not advance the positions
    return rows


def test_buckets_match_transformers() -> None:
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    width = 300
    idx = torch.arange(width)
    want = MPNetEncoder.relative_position_bucket(idx[None, :] - idx[:, None])
    assert torch.equal(relative_buckets(width, torch.device("cpu")), want)


def test_padding_ids_and_long_rows_match_transformers(nt: Any, tmp_path: Path) -> None:
    hf = nt.randomize(transformers.MPNetModel(mpnet_config()))
    native = nt.load_native(nt.save(hf, tmp_path))
    assert native.paths == ("packed", "dense")
    rows = rows_with_padding_ids()
    ref = nt.reference(hf, rows).last_hidden_state
    for i, got in enumerate(nt.encode(native, rows, "hidden")):
        nt.assert_close(got, ref[i, : len(rows[i])])
    from vllm_srun.plugins.base import Batch, WorkItem

    small = rows[:3]
    dense = native.encode(
        Batch.from_items([WorkItem(token_ids=r, output="hidden") for r in small]), path="dense"
    )
    for i, got in enumerate(dense):
        nt.assert_close(got, ref[i, : len(small[i])])


def test_fewer_buckets_than_looked_up_is_refused(nt: Any, tmp_path: Path) -> None:
    hf = transformers.MPNetModel(mpnet_config(relative_attention_num_buckets=16))
    with pytest.raises(ConfigError, match="relative_attention_num_buckets 16"):
        nt.load_native(nt.save(hf, tmp_path))

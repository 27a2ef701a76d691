"""Qwen3 beyond the table-driven parity test (test_parity.py, right-padded references):
left-padded references (how Qwen3-Embedding's tokenizer pads, positions then starting later in
each row) agree with packed rows within 1e-4; the token a classifier scores (the rightmost that
is not the pad token, as Transformers picks it) within 1e-4; causality (a row's prefix computes
what the prefix alone does); and the configurations the module refuses by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vllm_srun.errors import ConfigError  # noqa: E402
from vllm_srun.testing import task_heads_fixtures as fx  # noqa: E402

ATOL = 1e-4


def _model(
    kind: str, tmp_path: Path, nt: Any, labels: int = 2, flavour: str = "qwen3"
) -> tuple[Any, Any, int]:
    _, fixture = fx.fixture_of(flavour)
    _, vocab, ids = fx.TOKENIZERS[fixture.tokenizer]()
    config = fx._config(flavour, vocab, ids)
    config._attn_implementation = "eager"
    names = [f"LABEL_{i}" for i in range(labels)] if kind == "sequence" else None
    hf = nt.randomize(fx._model("qwen3", kind, names, config, multilabel=False), seed=5)
    return hf, nt.load_native(nt.save(hf, tmp_path / kind)), vocab


def _left_padded(hf: Any, rows: list[list[int]]) -> Any:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(hf.config.pad_token_id), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask), width


def _rows(vocab: int, nt: Any, pad: int) -> list[list[int]]:
    rows = nt.token_rows(vocab, seed=4)
    return [[t if t != pad else pad - 1 for t in row] for row in rows]


def test_left_padded_hidden_states_agree_with_packed_rows(tmp_path: Path, nt: Any) -> None:
    hf, native, vocab = _model("model", tmp_path, nt)
    rows = _rows(vocab, nt, hf.config.pad_token_id)
    out, width = _left_padded(hf, rows)
    got = nt.encode(native, rows, "hidden")
    worst = 0.0
    for i, (row, g) in enumerate(zip(rows, got, strict=True)):
        want = out.last_hidden_state[i, width - len(row) :]
        nt.assert_close(g, want, atol=ATOL)
        worst = max(worst, float(np.abs(g - want.numpy()).max()))
    # Last-token pooling reads the row's last position, the same cell in either padding.
    last = nt.encode(native, rows, "last")
    for i, g in enumerate(last):
        nt.assert_close(g, out.last_hidden_state[i, -1], atol=ATOL)
    assert worst < ATOL


def test_left_padded_sequence_logits_agree_with_packed_rows(tmp_path: Path, nt: Any) -> None:
    hf, native, vocab = _model("sequence", tmp_path, nt, labels=1)
    rows = _rows(vocab, nt, hf.config.pad_token_id)
    out, _ = _left_padded(hf, rows)
    for g, want in zip(nt.encode(native, rows, "logits"), out.logits, strict=True):
        nt.assert_close(g, want, atol=ATOL)


def test_the_scored_token_is_the_rightmost_that_is_not_the_pad_token(tmp_path: Path, nt: Any) -> None:
    # Qwen's tokenizers append <|endoftext|>, which is also their pad token: Transformers scores
    # the token before it (and before any run of pad ids), not the row's last one.
    hf, native, vocab = _model("sequence", tmp_path, nt, labels=1, flavour="qwen3-eot-pad")
    pad = int(hf.config.pad_token_id)
    body = _rows(vocab, nt, pad)
    rows = [
        body[0] + [pad],  # as the tokenizer writes every text
        body[1] + [pad, pad],
        [*body[3][:7], pad, *body[3][7:], pad],  # a pad id inside the row too
        body[4],  # no pad at all: its last token
        [pad, pad, pad],  # pad ids only: the reference's argmax over none is the first token
    ]
    got = nt.encode(native, rows, "logits")
    last = nt.encode(native, rows, "hidden")
    for row, g in zip(rows, got, strict=True):
        with torch.no_grad():  # each row alone: no padding for the reference to see
            want = hf(input_ids=torch.tensor([row])).logits[0]
        nt.assert_close(g, want, atol=ATOL)
    # The right-padded batch (pad ids after every row) picks the same tokens.
    for g, want in zip(got, nt_padded(hf, rows, pad), strict=True):
        nt.assert_close(g, want, atol=ATOL)
    # The row's own last token would have scored otherwise (the choice before this head).
    with torch.no_grad():
        weight = hf.score.weight.numpy()
    for i in range(3):
        assert abs(float((weight @ last[i][-1])[0]) - float(got[i][0])) > 1e-3


def nt_padded(hf: Any, rows: list[list[int]], pad: int) -> Any:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask).logits


def test_without_a_pad_token_the_last_token_is_scored(tmp_path: Path, nt: Any) -> None:
    hf, _, vocab = _model("sequence", tmp_path, nt, labels=1, flavour="qwen3-eot-pad")
    config = json.loads((tmp_path / "sequence" / "config.json").read_text())
    config["pad_token_id"] = None
    (tmp_path / "sequence" / "config.json").write_text(json.dumps(config))
    native = nt.load_native(tmp_path / "sequence")
    pad = int(hf.config.pad_token_id)
    row = _rows(vocab, nt, pad)[0] + [pad]
    hf.config.pad_token_id = None
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([row])).logits[0]
    nt.assert_close(nt.encode(native, [row], "logits")[0], want, atol=ATOL)


@pytest.mark.parametrize("bias", [True, False])
def test_the_tagger_is_score_on_every_token(tmp_path: Path, nt: Any, bias: bool) -> None:
    # Qwen3ForTokenClassification: `score` with a bias unless token_classification_bias is false.
    _, fixture = fx.fixture_of("qwen3")
    _, vocab, ids = fx.TOKENIZERS[fixture.tokenizer]()
    config = fx._config("qwen3", vocab, ids)
    config._attn_implementation = "eager"
    config.token_classification_bias = bias
    hf = nt.randomize(fx._model("qwen3", "token", ["O", "B", "I"], config, multilabel=False), seed=6)
    assert (hf.score.bias is not None) is bias
    native = nt.load_native(nt.save(hf, tmp_path / "token"))
    rows = _rows(vocab, nt, hf.config.pad_token_id)
    out, width = _left_padded(hf, rows)
    for i, (row, got) in enumerate(zip(rows, nt.encode(native, rows, "token_logits"), strict=True)):
        nt.assert_close(got, out.logits[i, width - len(row) :], atol=ATOL)


def test_a_prefix_computes_what_it_computes_alone(tmp_path: Path, nt: Any) -> None:
    # Causal: no token sees a later one, so the first k states of a row are the k-token row's.
    _, native, vocab = _model("model", tmp_path, nt)
    row = nt.token_rows(vocab, lengths=(30,), seed=8)[0]
    full, prefix = nt.encode(native, [row, row[:11]], "hidden")
    np.testing.assert_allclose(full[:11], prefix, atol=1e-5, rtol=0)
    assert not np.allclose(full[10], full[29], atol=1e-3)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "'yarn'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "'linear'"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        ({"use_sliding_window": True, "layer_types": ["sliding_attention", "full_attention"]}, "sliding"),
        ({"num_key_value_heads": 3}, "num_key_value_heads 3"),
    ],
)
def test_what_is_not_implemented_is_refused_by_name(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    from vllm_srun.engines.native.qwen3 import Qwen3

    config = json.loads(
        (fx.write_fixture(tmp_path, variant="qwen3-embedding", weights=False) / "config.json").read_text()
    )
    Qwen3(config)  # as written, it builds
    config.update(change)
    with torch.device("meta"), pytest.raises(ConfigError) as caught:
        Qwen3(config)
    assert named in str(caught.value)


def test_the_hub_spelling_of_theta_is_read(tmp_path: Path) -> None:
    from vllm_srun.engines.native.qwen3 import rope_theta

    assert rope_theta({"rope_theta": 1e6, "rope_scaling": None}) == 1e6
    assert rope_theta({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}) == 5e5
    # The fixture's config.json carries both spellings (its hub_config), with the same value.
    config = json.loads(
        (fx.write_fixture(tmp_path, variant="qwen3-reranker", weights=False) / "config.json").read_text()
    )
    assert (config["rope_theta"], config["rope_parameters"]["rope_theta"]) == (1000.0, 1000.0)
    assert rope_theta(config) == 1000.0
    assert rope_theta({**config, "rope_theta": 5.0}) == 1000.0  # rope_parameters wins, as in Transformers 5

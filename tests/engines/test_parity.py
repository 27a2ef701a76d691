"""Every row of the architecture table against its Transformers reference, on every path.

Cases come from the table itself (`vllm_srun.plugins.architectures`): each fixture flavour of
each row, each head kind it declares, built by the fixture writer's config with every
parameter redrawn (so zero biases or unit norms cannot hide a wiring mistake), saved with
`save_pretrained` and loaded back by the native engine. A new row is tested by this file
without a line added here. Tolerances: hidden states, logits and token logits within 1e-4
(float32) of Transformers on right-padded batches; packed rows of a mixed batch equal the
same row run alone within 1e-5; the small-batch paths equal the packed path within 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vllm_srun.plugins.architectures import architectures  # noqa: E402
from vllm_srun.testing import task_heads_fixtures as fx  # noqa: E402

LABELS = {"sequence": ["a", "b", "c"], "token": ["O", "B", "I", "X"], "model": None}
OUTPUT = {"model": "hidden", "sequence": "logits", "token": "token_logits"}
# Lengths past 8 reach beyond the fixtures' sliding windows; one row of 1 token.
LENGTHS = (5, 23, 1, 40, 12, 31)


def cases() -> list[Any]:
    out = []
    for arch in architectures():
        kinds = sorted({kind for kind, _ in arch.classes.values()})
        for flavour in arch.fixtures:
            for kind in kinds:
                out.append(pytest.param(flavour, kind, id=f"{flavour}-{kind}"))
    return out


def build(flavour: str, kind: str, tmp_path: Path, nt: Any) -> tuple[Any, Any, Any, int]:
    """(Transformers model, native model, table row, vocab size) of one case."""
    hf, path, arch, vocab = saved(flavour, kind, tmp_path, nt)
    return hf, nt.load_native(path), arch, vocab


def saved(flavour: str, kind: str, tmp_path: Path, nt: Any) -> tuple[Any, Path, Any, int]:
    """(Transformers model, the folder it is saved in, table row, vocab size) of one case,
    every parameter redrawn."""
    arch, fixture = fx.fixture_of(flavour)
    _, vocab, ids = fx.TOKENIZERS[fixture.tokenizer]()
    config = fx._config(flavour, vocab, ids)
    config._attn_implementation = "eager"
    head = {"model": "model", "sequence": "sequence", "token": "token"}[kind]
    hf = nt.randomize(fx._model(flavour, head, LABELS[kind], config, multilabel=False), seed=3)
    return hf, nt.save(hf, tmp_path / flavour), arch, vocab


def rows_for(vocab: int, nt: Any) -> list[list[int]]:
    # Ids from 5 up: below are the fixtures' special tokens (pad among them).
    rng = np.random.default_rng(11)
    return [rng.integers(5, vocab, size=n).tolist() for n in LENGTHS]


def expected(hf: Any, kind: str, rows: list[list[int]], types: list[list[int]] | None) -> list[np.ndarray]:
    out = nt_reference(hf, rows, types)
    if kind == "sequence":
        return [out.logits[i].numpy() for i in range(len(rows))]
    values = out.last_hidden_state if kind == "model" else out.logits
    return [values[i, : len(r)].numpy() for i, r in enumerate(rows)]


def nt_reference(hf: Any, rows: list[list[int]], types: list[list[int]] | None) -> Any:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(hf.config.pad_token_id or 0), dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        t = torch.zeros_like(ids)
        for i, row in enumerate(types):
            t[i, : len(row)] = torch.tensor(row)
        kwargs["token_type_ids"] = t
    with torch.no_grad():
        return hf(**kwargs, output_hidden_states=True)


def pair_types(rows: list[list[int]]) -> list[list[int]]:
    """Type ids of text pairs: the second half of each row is segment 1."""
    return [[0] * (len(r) - len(r) // 2) + [1] * (len(r) // 2) for r in rows]


@pytest.mark.parametrize(("flavour", "kind"), cases())
def test_packed_rows_match_transformers(flavour: str, kind: str, tmp_path: Path, nt: Any) -> None:
    hf, native, arch, vocab = build(flavour, kind, tmp_path, nt)
    rows = rows_for(vocab, nt)
    types = pair_types(rows) if arch.uses_type_ids(hf.config.to_dict()) else None
    want = expected(hf, kind, rows, types)
    got = nt.encode(native, rows, OUTPUT[kind], types)
    for g, w in zip(got, want, strict=True):
        nt.assert_close(g, w, atol=1e-4)
    nt.assert_rows_match_solo(native, rows, [OUTPUT[kind]] * len(rows))


@pytest.mark.parametrize(("flavour", "kind"), cases())
def test_small_batch_paths_match_packed(flavour: str, kind: str, tmp_path: Path, nt: Any) -> None:
    _, native, arch, vocab = build(flavour, kind, tmp_path, nt)
    assert native.paths[0] == "packed"
    assert ("dense" in native.paths) == ("dense" in arch.fast_paths)
    rows = rows_for(vocab, nt)[:3]  # a small batch: 5, 23 and 1 tokens (padding masked)
    items = [[r] for r in rows] + [rows]
    for batch in items:
        packed = _run(native, batch, OUTPUT[kind], "packed")
        for path in native.paths[1:]:
            for a, b in zip(_run(native, batch, OUTPUT[kind], path), packed, strict=True):
                np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"path {path}")


@pytest.mark.parametrize(("flavour", "kind"), [c for c in cases() if c.values[1] == "model"])
def test_early_exits_match_transformers_hidden_states(flavour: str, kind: str, tmp_path: Path, nt: Any) -> None:
    hf, native, _, vocab = build(flavour, kind, tmp_path, nt)
    rows = rows_for(vocab, nt)
    ref = nt_reference(hf, rows, None).hidden_states
    layers = native.exit_layers
    assert layers == tuple(range(1, hf.config.num_hidden_layers + 1))
    for layer in layers:
        got = nt.encode(native, rows, [f"hidden@{layer}"] * len(rows))
        for i, g in enumerate(got):
            nt.assert_close(g, ref[layer][i, : len(rows[i])], atol=1e-4)


def _run(native: Any, rows: list[list[int]], output: str, path: str) -> list[np.ndarray]:
    from vllm_srun.plugins.base import Batch, WorkItem

    return native.encode(Batch.from_items([WorkItem(token_ids=r, output=output) for r in rows]), path=path)

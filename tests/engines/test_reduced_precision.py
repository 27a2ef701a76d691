"""bfloat16 and int8 on the native engine against float32 Transformers, at the twin check's bounds.

Every row of the architecture table (each fixture flavour, each head kind it declares), built
as test_parity builds it (every parameter redrawn), run by the native engine in bfloat16 and
in int8 and compared with the float32 Transformers forward on the same rows, held to the
bounds `vllm_srun.registry.approximate` holds a served model to:

- bare encoders: the cosine of each row's mean-pooled hidden state (worst >= 0.9995 for
  bfloat16; worst >= 0.99 and mean >= 0.997 for int8);
- sequence heads: the top label agrees on >= 99.5% of rows, no label's probability moves by
  more than 0.02. The rerank bound (Kendall's tau >= 0.98) is not held here: a tiny random
  head's pooler saturates, so its rows' logits lie within ~0.003 of each other, under
  bfloat16's resolution of a logit near 1 (~0.004); ranking them is ranking noise;
- token heads: each token's top label agrees on >= 99.5% of tokens, the 99th percentile of a
  token's probability change within 0.02 (entity spans are the served model's: not held here).

Why these tolerances hold on tiny random models: they are the production bounds, not looser
ones. The fixtures' weights are drawn at std 0.2 (test_parity's `randomize`), far rougher than
a trained model's, so a bound that holds here is not flattered by the fixture; rows are long
enough (ROWS x ~24 tokens) that one flipped token is under the 0.5% the token bound allows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engines.test_parity import cases, nt_reference, saved  # noqa: E402

from vllm_srun.registry.approximate import bounds_for  # noqa: E402
from vllm_srun.testing import task_heads_fixtures as fx  # noqa: E402

OUTPUT = {"model": "mean", "sequence": "logits", "token": "token_logits"}
ROWS = 48
# Label agreement counts the rows (tokens) float32 decides by at least this much probability
# over the runner-up: a tiny random head leaves many near-ties (three labels within 0.001 of
# each other), whose top label any rounding flips; a flip of a tie is no lost accuracy, and the
# probability bound (0.02) still holds every row, tie or not.
DECIDED = 0.01
DTYPES = ("bfloat16", "int8")


def rows_of(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(5, vocab, size=int(n)).tolist() for n in rng.integers(8, 40, size=ROWS)]


def reference(hf: Any, kind: str, rows: list[list[int]]) -> list[np.ndarray]:
    """float32 Transformers on right-padded rows: what the native rows are compared with."""
    out = nt_reference(hf, rows, None)
    if kind == "sequence":
        return list(out.logits.numpy())
    if kind == "token":
        return [out.logits[i, : len(r)].numpy() for i, r in enumerate(rows)]
    hidden = out.last_hidden_state
    return [hidden[i, : len(r)].mean(0).numpy() for i, r in enumerate(rows)]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def figures(kind: str, got: list[np.ndarray], want: list[np.ndarray]) -> dict[str, float]:
    """The twin check's figures of `got` against `want` for a kind of output."""
    if kind == "model":
        a, b = np.stack(got).astype(np.float64), np.stack(want).astype(np.float64)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    a, b = np.concatenate([np.atleast_2d(g) for g in got]), np.concatenate([np.atleast_2d(w) for w in want])
    pa, pb = softmax(a.astype(np.float64)), softmax(b.astype(np.float64))
    top2 = np.sort(pb, axis=-1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] >= DECIDED
    agree = float(np.mean(a.argmax(-1)[decided] == b.argmax(-1)[decided]))
    deltas = np.abs(pa - pb).max(axis=-1)
    if kind == "token":
        return {
            "token_agreement": agree,
            "p99_probability_delta": float(np.percentile(deltas, 99)),
            "max_probability_delta": float(deltas.max()),
        }
    return {"label_agreement": agree, "max_probability_delta": float(deltas.max())}


def bounds(kind: str, dtype: str) -> list[Any]:
    if kind == "model":
        return [b for b in bounds_for("embeddings", dtype) if b.figure != "neighbour_overlap"]
    if kind == "token":  # spans are the served model's: this compares raw logits
        return [b for b in bounds_for("token", dtype) if b.figure != "span_agreement"]
    return list(bounds_for("classify", dtype))


@pytest.mark.parametrize(("flavour", "kind"), cases())
def test_reduced_precision_matches_float32_transformers(
    flavour: str, kind: str, tmp_path: Path, nt: Any
) -> None:
    hf, path, _, vocab = saved(flavour, kind, tmp_path, nt)
    rows = rows_of(vocab)
    want = reference(hf, kind, rows)
    for dtype in DTYPES:
        native = nt.load_native(path, dtype)
        got = nt.encode(native, rows, OUTPUT[kind])
        found = figures(kind, got, want)
        missed = [
            f"{b.figure} {found[b.figure]:.5f} (needs {b.words()})"
            for b in bounds(kind, dtype)
            if not b.holds(found[b.figure])
        ]
        assert not missed, f"{dtype}: {', '.join(missed)}; {found}"


def test_int8_without_bfloat16_instructions_keeps_those_linears_float32(
    tmp_path: Path, nt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU with VNNI but no BF16 (Cascade Lake), the linears int8 keeps out of int8 run
    in float32, not in emulated bfloat16; the rest are int8 all the same."""
    from vllm_srun.accelerators.cpu_features import FLAGS_ENV
    from vllm_srun.engines.native.quantize import Bfloat16Linear, Int8Linear

    _, fixture = fx.fixture_of("bert")
    _, vocab, ids = fx.TOKENIZERS[fixture.tokenizer]()
    hf = nt.randomize(
        fx._model("bert", "model", None, fx._config("bert", vocab, ids), multilabel=False), seed=3
    )
    path = nt.save(hf, tmp_path / "bert")
    kinds = {}
    for flags in ("avx512_vnni avx512_bf16", "avx512_vnni"):
        monkeypatch.setenv(FLAGS_ENV, flags)
        module = nt.load_native(path, "int8").module
        kinds[flags] = {
            type(m).__name__
            for m in module.modules()
            if isinstance(m, (Bfloat16Linear, Int8Linear, torch.nn.Linear))
        }
    assert kinds["avx512_vnni avx512_bf16"] == {"Bfloat16Linear", "Int8Linear"}
    assert kinds["avx512_vnni"] == {"Linear", "Int8Linear"}


def test_small_reduced_precision_forwards_run_on_one_thread(
    tmp_path: Path, nt: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bfloat16 or int8 batch of at most its dtype's ONE_THREAD_MACS multiply-adds in the
    linears runs on one thread, a larger one and any float32 batch on the thread count set,
    which is restored after each forward."""
    from vllm_srun.engines.native import engine
    from vllm_srun.plugins.base import Batch, WorkItem

    _, path, _, vocab = saved("bert", "model", tmp_path, nt)
    rng = np.random.default_rng(2)
    small = [rng.integers(5, vocab, size=30).tolist() for _ in range(2)]  # 60 tokens
    large = [rng.integers(5, vocab, size=40).tolist() for _ in range(2)]  # 80 tokens
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for dtype, rows, want in (
            ("bfloat16", small, 1),
            ("int8", small, 1),
            ("bfloat16", large, 2),
            ("int8", large, 2),
            ("float32", small, 2),
        ):
            native = nt.load_native(path, dtype)
            macs = native.linear_macs
            # Every linear of each layer counted (q/k/v, attention output, the FFN's two).
            config = json.loads((path / "config.json").read_text())
            h, i = config["hidden_size"], config["intermediate_size"]
            assert macs >= config["num_hidden_layers"] * (4 * h * h + 2 * h * i), macs
            # The bound between the two batches' sizes: 60 tokens' worth, for each dtype.
            monkeypatch.setattr(engine, "ONE_THREAD_MACS", {"bfloat16": 60 * macs, "int8": 60 * macs})
            seen: list[int] = []
            native.module.register_forward_pre_hook(
                lambda *_, seen=seen: seen.append(torch.get_num_threads())
            )
            items = [WorkItem(token_ids=r, output="mean") for r in rows]
            native.encode(Batch.from_items(items), path="packed")  # float32's small batches go to ORT
            assert seen and set(seen) == {want}, f"{dtype}, {sum(map(len, rows))} tokens: {seen}"
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

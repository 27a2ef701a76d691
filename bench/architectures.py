"""Forward speed per architecture: the native engine against Transformers, random weights.

    python bench/architectures.py [--sizes mini,base] [--texts 256] [--batch 32] [--threads N]
                                  [--only bert,roberta,...] [--markdown]

For every row of the architecture table (its first fixture flavour), a random-weight bare
encoder at MiniLM size ("mini": 6 layers x 384, 12 heads) and base size ("base": 12 x 768,
12 heads), with the row's own config class and defaults. Both engines get the same token ids
(lengths drawn from the bench corpus as all-MiniLM-L6-v2's tokenizer splits it; ids random
over the vocabulary) and the same torch thread count, in one process:

- packed: native, batches of `--batch` in input order, packed rows, mean pooled by the engine;
  Transformers (its default attention), the same rows sorted by length and padded with a mask
  (its best case), masked mean pooling. The two alternate batch by batch.
- small: batch 1, one row at a time (the lone request): native's small-batch path as
  `choose_path` picks it, against Transformers on the same row.

Prints texts/s of each and the ratio native/Transformers (higher is better for native); the
ratios are what count on a shared machine. A max |native - Transformers| check on the first
batch guards that both compute the same thing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_srun.engines.native import NativeEngine
from vllm_srun.plugins.architectures import architectures
from vllm_srun.plugins.base import Batch, Device, ModelSpec, WorkItem

SIZES = {"mini": (6, 384, 1536), "base": (12, 768, 3072)}
HEADS = 12
WARM = 2


def lengths(count: int) -> list[int]:
    """Token counts of the bench corpus as MiniLM's tokenizer splits it (no truncation past 512)."""
    from bench.native_forward import model_dir, tokenize
    from vllm_srun.registry.corpus import corpus

    return [min(len(r), 512) for r in tokenize(model_dir(), corpus(count))]


def build(flavour: str, size: str, out: Path) -> tuple[Any, Any]:
    """(Transformers model, native model) of a random bare encoder of `flavour` at `size`."""
    from vllm_srun.testing import task_heads_fixtures as fx

    layers, hidden, inner = SIZES[size]
    arch, fixture = fx.fixture_of(flavour)
    _, vocab, ids = fx.TOKENIZERS[fixture.tokenizer]()
    config = fx._config(flavour, vocab, ids)
    sizes = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "intermediate_size": inner,
        "max_position_embeddings": 600 + (int(config.pad_token_id or 0) + 1 if arch.position_offset else 0),
    }
    for key, value in sizes.items():
        setattr(config, key, value)
        own = arch.config_keys.get(key, key)
        if own != key and hasattr(config, own):  # a config class with its own spelling (DistilBERT's)
            setattr(config, own, value)
    config.initializer_range = 0.02  # as released checkpoints are scaled (the fixtures use 0.2)
    for name, value in (
        ("embedding_size", hidden),
        ("pooler_hidden_size", hidden),
        ("head_dim", hidden // HEADS),
        ("num_key_value_heads", HEADS // 2),
        ("local_attention", 128),
        ("position_buckets", 256),
        ("max_relative_positions", -1),
    ):
        if hasattr(config, name):
            setattr(config, name, value)
    if getattr(config, "layer_types", None):  # per-layer kinds (ModernBERT, decoders): as released, every 3rd global
        kinds = sorted(set(config.layer_types))
        if len(kinds) > 1:
            config.layer_types = ["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(layers)]
        else:
            config.layer_types = kinds * layers
    torch.manual_seed(0)
    hf = fx._model(flavour, "model", None, config, multilabel=False).eval()
    hf.save_pretrained(str(out), safe_serialization=True)
    data = json.loads((out / "config.json").read_text())
    spec = ModelSpec(
        family="bench",
        architecture=data["architectures"][0],
        config=data,
        weight_files=tuple(sorted(out.glob("*.safetensors"))),
    )
    engine = NativeEngine()
    native = engine.load(spec, Device("cpu"), "float32", engine.read(spec, "float32"))
    return hf, native


def rows_of(counts: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(5, vocab, size=n).tolist() for n in counts]


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for j, row in enumerate(rows):
        ids[j, : len(row)] = torch.tensor(row)
        mask[j, : len(row)] = 1
    return ids, mask


def hf_mean(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return ((hidden * weights).sum(1) / weights.sum(1)).numpy()


def native_mean(native: Any, rows: list[list[int]]) -> list[np.ndarray]:
    return native.encode(Batch.from_items([WorkItem(token_ids=r, output="mean") for r in rows]))


def time_packed(hf: Any, native: Any, rows: list[list[int]], batch: int, pad: int) -> tuple[float, float, float]:
    """(native s, Transformers s, max abs diff on the first batch)."""
    nbatches = [rows[i : i + batch] for i in range(0, len(rows), batch)]
    ordered = sorted(rows, key=len)
    pbatches = [padded(ordered[i : i + batch], pad) for i in range(0, len(ordered), batch)]
    with torch.inference_mode():
        first = nbatches[0]
        order = sorted(range(len(first)), key=lambda i: len(first[i]))
        want = hf_mean(hf, *padded([first[i] for i in order], pad))
        got = np.stack(native_mean(native, first))[order]
        diff = float(np.abs(got - want).max())
        native_s = hf_s = 0.0
        for nb, (ids, mask) in zip(nbatches, pbatches, strict=True):
            start = time.perf_counter()
            native_mean(native, nb)
            middle = time.perf_counter()
            hf_mean(hf, ids, mask)
            native_s, hf_s = native_s + middle - start, hf_s + time.perf_counter() - middle
    return native_s, hf_s, diff


def time_single(hf: Any, native: Any, rows: list[list[int]], pad: int) -> tuple[float, float]:
    with torch.inference_mode():
        for row in rows[:WARM]:
            native_mean(native, [row])
            hf_mean(hf, *padded([row], pad))
        native_s = hf_s = 0.0
        for row in rows:
            start = time.perf_counter()
            native_mean(native, [row])
            middle = time.perf_counter()
            hf_mean(hf, *padded([row], pad))
            native_s, hf_s = native_s + middle - start, hf_s + time.perf_counter() - middle
    return native_s, hf_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--single", type=int, default=32, help="rows timed one at a time")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--only", default="", help="comma-separated row names")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    counts = lengths(args.texts)
    only = {n for n in args.only.split(",") if n}
    lines = []
    for arch in architectures():
        if (only and arch.name not in only) or not arch.fixtures:
            continue
        flavour = next(iter(arch.fixtures))
        for size in args.sizes.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    hf, native = build(flavour, size, Path(tmp))
                except Exception as exc:  # one row that cannot be built does not end the table
                    print(f"{arch.name:<11} {size:<4} not built: {type(exc).__name__}: {exc}", flush=True)
                    continue
            pad = int(hf.config.pad_token_id or 0)
            rows = rows_of(counts, native.module.vocab_size)
            n_s, h_s, diff = time_packed(hf, native, rows, args.batch, pad)
            singles = rows[: args.single]
            s_n, s_h = time_single(hf, native, singles, pad)
            small = native.choose_path(np.array([len(singles[0])]))
            lines.append(
                (arch.name, size, len(rows) / h_s, len(rows) / n_s, h_s / n_s, s_h / s_n, small, diff)
            )
            print(
                f"{arch.name:<11} {size:<4} packed: hf {len(rows) / h_s:7.1f} native {len(rows) / n_s:7.1f} "
                f"texts/s = {h_s / n_s:.2f}x | batch 1 ({small}): {s_h / s_n:.2f}x | max diff {diff:.1e}",
                flush=True,
            )
    if args.markdown:
        print(f"\n{len(counts)} texts, batch {args.batch}, {args.threads} torch threads, random weights\n")
        print("| architecture | size | Transformers texts/s | native texts/s | packed ratio | batch-1 ratio (path) |")
        print("|---|---|---|---|---|---|")
        for name, size, hf_rate, n_rate, ratio, single, path, _ in lines:
            print(f"| {name} | {size} | {hf_rate:.1f} | {n_rate:.1f} | {ratio:.2f}x | {single:.2f}x ({path}) |")


if __name__ == "__main__":
    main()

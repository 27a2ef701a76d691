"""The bound the CPU's linears put on an encoder's throughput, per dtype.

    python -m bench.linear_bound [--model-dir DIR] [--texts 512] [--batch 64] [--dtypes float32,bfloat16]

A forward's linears cost the same multiply-adds per token whatever the engine
(`NativeModel.linear_macs`, over the loaded model's `linear_shapes`). This measures oneDNN's
packed linear (`PackedLinear`, what the native engine runs) at each of those shapes, with as many
rows as one batch of `--batch` corpus texts has tokens, and divides: `bound_texts_per_s` is the
throughput a forward would reach if everything but its linears took no time, on these threads.
Beside it, the native engine's own forward on the same texts in batches of `--batch` (tokenizing
outside the timed region) and the share of the bound it reaches. Both sides keep their fastest
round. A served figure above the bound is out of reach on this machine for any server that does
the same arithmetic on linears no faster than oneDNN's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.corpus import corpus

if TYPE_CHECKING:
    import torch

    from vllm_srun.engines.native.engine import NativeModel

# torch and the engine are imported inside the functions: `main` sets the OpenMP policy first,
# as `vllm-srun serve` does, which the runtime reads only when torch loads it.
ROUNDS = 7


def _fastest_s(call: Any, rounds: int) -> float:
    """The fastest of `rounds` timed calls after one untimed: what the machine can do, which a
    neighbour's load on shared cores only ever slows."""
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def linear_gmacs(shapes: list[tuple[int, int]], rows: int, dtype: torch.dtype, rounds: int = ROUNDS) -> float:
    """oneDNN's packed linear rate over `shapes` ((in, out), each as often as it is listed) at
    `rows` tokens, in GMAC/s."""
    import torch

    from vllm_srun.engines.native.packed import PackedLinear

    seconds = macs = 0.0
    with torch.inference_mode():
        for (width_in, width_out), count in Counter(shapes).items():
            linear = PackedLinear(torch.nn.Linear(width_in, width_out).to(dtype))
            x = torch.randn(rows, width_in, dtype=dtype)
            seconds += count * _fastest_s(partial(linear, x), rounds)
            macs += count * rows * width_in * width_out
    return macs / seconds / 1e9


def forward_texts_per_s(model: NativeModel, rows: list[list[int]], batch: int, rounds: int) -> float:
    import torch

    from bench.native_forward import native_batches

    batches = native_batches(rows, batch)
    with torch.inference_mode():
        seconds = _fastest_s(lambda: [model.encode(b) for b in batches], rounds)
    return len(rows) / seconds


def measure(path: Path, texts: int, batch: int, dtypes: list[str], rounds: int = ROUNDS) -> dict[str, Any]:
    import torch

    from bench.native_forward import load_native, tokenize

    rows = tokenize(path, corpus(texts))
    tokens_per_text = sum(map(len, rows)) / len(rows)
    result: dict[str, Any] = {
        "model": str(path),
        "threads": torch.get_num_threads(),
        "texts": texts,
        "batch": batch,
        "tokens_per_text": tokens_per_text,
        "dtypes": {},
    }
    for dtype in dtypes:
        model = load_native(path, dtype)
        result["linear_macs_per_token"] = model.linear_macs
        gmacs = linear_gmacs(
            model.linear_shapes, round(batch * tokens_per_text), getattr(torch, dtype), rounds
        )
        bound = gmacs * 1e9 / (model.linear_macs * tokens_per_text)
        forward = forward_texts_per_s(model, rows, batch, max(1, rounds // 2))
        result["dtypes"][dtype] = {
            "linear_gmacs": gmacs,
            "bound_texts_per_s": bound,
            "forward_texts_per_s": forward,
            "forward_share_of_bound": forward / bound,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the packaged all-MiniLM-L6-v2")
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    from bench.__main__ import same_threads

    same_threads(None)  # every core, and the OpenMP policy `vllm-srun serve` sets
    from bench.native_forward import model_dir

    result = measure(
        args.model_dir or model_dir(), args.texts, args.batch, args.dtypes.split(","), args.rounds
    )
    print(
        f"{result['tokens_per_text']:.1f} tokens per text, {result['linear_macs_per_token'] / 1e6:.2f}M linear "
        f"multiply-adds per token, {result['threads']} threads"
    )
    print("| dtype | oneDNN linear GMAC/s | bound texts/s | forward texts/s | share of bound |")
    print("|---|---|---|---|---|")
    for dtype, row in result["dtypes"].items():
        print(
            f"| {dtype} | {row['linear_gmacs']:.0f} | {row['bound_texts_per_s']:.0f} | "
            f"{row['forward_texts_per_s']:.0f} | {row['forward_share_of_bound']:.2f} |"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

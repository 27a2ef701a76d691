"""float32, bfloat16 and int8 on the native engine, in one run: texts/s at one batch and accuracy.

    python -m bench.dtypes [--model minilm|base] [--batch 64] [--tokens 40] [--repeats 7]
                           [--dtypes float32,bfloat16,int8] [--threads N] [--profile] [--keep-freed]

One batch of `--batch` texts of the bench corpus, each cut to `--tokens` MiniLM tokens (texts
shorter than that are skipped), mean pooled on the packed path. Each repeat times one forward
of every dtype in turn (so drift on a shared machine hits all alike); the figure is the median
over `--repeats`, and the ratio is to float32's median. Accuracy: worst and mean cosine of the
batch's embeddings against float32's. "base" is a random-init 12 x 768 BERT,
"minilm12" MiniLM's layers stacked twice (bench/int8_layers.py). `--profile` adds torch.profiler's per-op table of one forward per
dtype and the share of its self CPU time outside the GEMMs. `--keep-freed` raises glibc's mmap
and trim thresholds first (mallopt), so a freed [tokens, 1536] tensor's pages are reused
instead of returned to the kernel and faulted in again by the next allocation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.int8_layers import cosines, random_base, stacked_minilm
from bench.native_forward import load_native, model_dir, tokenize
from vllm_srun.plugins.base import Batch, WorkItem
from vllm_srun.registry.corpus import corpus

# What torch.profiler names the matrix products of a forward (float, bfloat16 and int8).
GEMM_OPS = (
    "aten::addmm",
    "aten::mm",
    "aten::_int_mm",
    "aten::bmm",
    "aten::linear",
    "quantized::linear_dynamic",
)


def gemm_share(prof: torch.profiler.profile) -> tuple[float, float]:
    """(total self CPU ms, share outside the GEMM ops) of a profiled forward."""
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(
        e.self_cpu_time_total for e in events if e.key in GEMM_OPS or "mkldnn" in e.key or "onednn" in e.key
    )
    return total / 1e3, 1 - gemm / total


def keep_freed_memory() -> None:
    """glibc: serve large allocations from the heap and keep freed memory (M_MMAP_THRESHOLD -3,
    M_TRIM_THRESHOLD -1, at 1 GiB)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    for option in (-3, -1):
        libc.mallopt(option, 1 << 30)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="minilm", choices=("minilm", "minilm12", "base"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtypes", default="float32,bfloat16,int8")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--keep-freed", action="store_true")
    args = parser.parse_args()
    if args.keep_freed:
        keep_freed_memory()
    torch.set_num_threads(args.threads)
    rows = [
        r[: args.tokens]
        for r in tokenize(model_dir(), corpus(4 * args.batch, seed=3))
        if len(r) >= args.tokens
    ]
    rows = rows[: args.batch]
    batch = Batch.from_items([WorkItem(token_ids=r, output="mean") for r in rows])
    dtypes = args.dtypes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        path = {"minilm": lambda: model_dir(), "minilm12": lambda: stacked_minilm(Path(tmp))}.get(
            args.model, lambda: random_base(Path(tmp))
        )()
        models = {d: load_native(path, d) for d in dtypes}
    results = {d: np.stack(m.encode(batch)) for d, m in models.items()}  # warm-up, and the accuracy
    times: dict[str, list[float]] = {d: [] for d in dtypes}
    for _ in range(args.repeats):
        for d, m in models.items():
            start = time.perf_counter()
            m.encode(batch)
            times[d].append(time.perf_counter() - start)
    base = statistics.median(times[dtypes[0]])
    print(
        f"{args.model}: batch {len(rows)} x {args.tokens} tokens, {args.threads} threads, "
        f"median of {args.repeats}; ratio and cosines against {dtypes[0]}"
    )
    for d in dtypes:
        median = statistics.median(times[d])
        worst, mean = cosines(results[d].astype(np.float64), results[dtypes[0]].astype(np.float64))
        print(
            f"{d:<9} {len(rows) / median:8.1f} texts/s  {base / median:5.2f}x  "
            f"worst cosine {worst:.6f}  mean {mean:.6f}"
        )
    if args.profile:
        for d, m in models.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                m.encode(batch)
            total, outside = gemm_share(prof)
            print(f"\n## {d}: {total:.1f} ms self CPU, {outside:.1%} outside GEMMs")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
